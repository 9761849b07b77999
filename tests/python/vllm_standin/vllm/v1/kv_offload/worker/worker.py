"""Stand-in of vllm/v1/kv_offload/worker/worker.py, modelled on
vllm-project/vllm at 06bb4a63a14b5b1f34ad9455e8e4aa017ee6e0f3.

Runs in each WORKER process (one per GPU rank).
- TransferSpec = (src LoadStoreSpec, dst LoadStoreSpec).
- TransferResult(job_id, success, transfer_size=None bytes,
  transfer_time=None seconds, transfer_type=None (src, dst) mediums).
- OffloadingHandler: transfer_async(job_id, spec) -> bool (True: submitted;
  it must not block on the copy), get_finished() -> list[TransferResult]
  (each job reported once, since the last call), wait(job_ids) blocks until
  those jobs finished, shutdown() optional.
- OffloadingWorker routes by (src.medium(), dst.medium()) to the handler
  registered for it (register_handler asserts one per pair); an exception
  or False from a handler is logged and returned as False; get_finished
  and wait fan out to every handler.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass

from vllm.logger import init_logger
from vllm.v1.kv_offload.abstract import LoadStoreSpec

TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]
TransferType = tuple[str, str]

logger = init_logger(__name__)


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None
    transfer_type: TransferType | None = None


class OffloadingHandler(ABC):
    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        ...

    @abstractmethod
    def get_finished(self) -> list[TransferResult]:
        ...

    @abstractmethod
    def wait(self, job_ids: set[int]) -> None:
        ...

    def shutdown(self) -> None:  # noqa: B027 (optional)
        return


class OffloadingWorker:
    def __init__(self):
        self.handlers: list[OffloadingHandler] = []
        self.transfer_type_to_handler: dict[TransferType, OffloadingHandler] = {}

    def register_handler(self, src_cls, dst_cls, handler: OffloadingHandler) -> None:
        transfer_type = (src_cls.medium(), dst_cls.medium())
        assert transfer_type not in self.transfer_type_to_handler
        if all(h is not handler for h in self.handlers):
            self.handlers.append(handler)
        self.transfer_type_to_handler[transfer_type] = handler

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        src, dst = spec
        transfer_type = (src.medium(), dst.medium())
        handler = self.transfer_type_to_handler.get(transfer_type)
        assert handler is not None, f"no handler for {transfer_type}"
        try:
            ok = handler.transfer_async(job_id, spec)
        except Exception:  # as vLLM: logged, reported as not submitted
            logger.warning("exception in %r transfer %d", transfer_type, job_id,
                           exc_info=True)
            return False
        if not ok:
            logger.warning("failed to submit %r transfer %d", transfer_type, job_id)
        return ok

    def get_finished(self) -> list[TransferResult]:
        finished = []
        for handler in self.handlers:
            finished.extend(handler.get_finished())
        return finished

    def wait(self, job_ids: set[int]) -> None:
        for handler in self.handlers:
            handler.wait(job_ids)

    def shutdown(self) -> None:
        for handler in self.handlers:
            handler.shutdown()
