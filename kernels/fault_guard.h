// Contains a SIGBUS raised while copying to or from memory another process
// controls (a client's shared-memory segment it truncated under us) to the
// one copy that touched it.
//
// A process-wide SIGBUS handler (installed once, SA_SIGINFO | SA_NODEFER)
// jumps back to the innermost guarded call of the faulting thread. A SIGBUS
// outside any guarded call restores the action that was there before (by
// default: terminate with a core) and re-raises it, so a real bug in the
// daemon still crashes it.
#ifndef HOSTKV_KERNELS_FAULT_GUARD_H_
#define HOSTKV_KERNELS_FAULT_GUARD_H_

#include <cstdint>

namespace hostkv {

// Installs the SIGBUS handler; idempotent and thread-safe. RunGuarded calls
// it too; call it early to install the handler before other threads start.
void InstallFaultHandler();

// What a guarded call ran into.
struct GuardedFault {
  bool faulted = false;
  uintptr_t address = 0;  // si_addr of the SIGBUS
};

// Runs fn(arg) on this thread. If it raises SIGBUS, abandons it at the fault
// (without unwinding) and returns the fault. Guarded calls do not nest.
// REQUIRES: fn's frames hold no object with a non-trivial destructor and no
// lock while they touch guarded memory (they are skipped, not unwound).
GuardedFault RunGuarded(void (*fn)(void*), void* arg);

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_FAULT_GUARD_H_
