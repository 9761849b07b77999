#include "kernels/fault_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace hostkv {
namespace {

// The jump target of the guarded call running on a thread.
struct GuardFrame {
  sigjmp_buf env;
  // Written by the handler, read after the jump: volatile so the value is
  // not one cached before the sigsetjmp.
  volatile uintptr_t address;
};

// initial-exec: reading it in the handler never allocates.
__attribute__((tls_model("initial-exec"))) thread_local GuardFrame* t_guard =
    nullptr;

struct sigaction g_previous;
std::once_flag g_install_once;

void OnSigbus(int sig, siginfo_t* info, void* /*context*/) {
  GuardFrame* frame = t_guard;
  if (frame != nullptr) {
    t_guard = nullptr;
    frame->address = reinterpret_cast<uintptr_t>(info->si_addr);
    // SA_NODEFER: SIGBUS is not blocked here, so no mask needs restoring.
    siglongjmp(frame->env, 1);
  }
  // Not a guarded copy: a bug of ours. Give the fault back to whoever had
  // it (by default the kernel's core dump). A fault from an instruction
  // re-runs it when this returns; a sent signal must be sent again.
  sigaction(SIGBUS, &g_previous, nullptr);
  if (info->si_code <= 0) raise(sig);
}

}  // namespace

void InstallFaultHandler() {
  std::call_once(g_install_once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &g_previous);
  });
}

GuardedFault RunGuarded(void (*fn)(void*), void* arg) {
  InstallFaultHandler();
  GuardFrame frame;
  frame.address = 0;
  // savemask = 0: no sigprocmask call per copy (see SA_NODEFER above).
  if (sigsetjmp(frame.env, 0) != 0) {
    // t_guard was cleared by the handler.
    GuardedFault fault;
    fault.faulted = true;
    fault.address = frame.address;
    return fault;
  }
  t_guard = &frame;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  fn(arg);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return GuardedFault{};
}

}  // namespace hostkv
