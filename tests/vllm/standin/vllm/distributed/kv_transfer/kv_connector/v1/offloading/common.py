"""Models .../kv_connector/v1/offloading/common.py at vllm-project/vllm
03f97cce: the metadata the scheduler sends its workers each step (load and
store jobs, jobs to flush) and the workers' reply (completed job counts)."""
from dataclasses import dataclass, field

ReqId = str


@dataclass
class TransferJob:
    req_id: ReqId
    src_spec: object
    dst_spec: object


@dataclass
class OffloadingConnectorMetadata:
    load_jobs: dict = field(default_factory=dict)    # job_id -> TransferJob
    store_jobs: dict = field(default_factory=dict)   # job_id -> TransferJob
    jobs_to_flush: set = field(default_factory=set)


@dataclass
class OffloadingWorkerMetadata:
    completed_jobs: dict = field(default_factory=dict)  # job_id -> count

    def mark_completed(self, job_id):
        self.completed_jobs[job_id] = self.completed_jobs.get(job_id, 0) + 1

    def aggregate(self, other):
        for job_id, n in other.completed_jobs.items():
            self.completed_jobs[job_id] = self.completed_jobs.get(job_id, 0) + n
        return self
