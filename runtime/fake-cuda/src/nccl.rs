//! NCCL (`libnccl.so`): not faked yet; a run that opens NCCL on the fake GPUs stops at its first call.
