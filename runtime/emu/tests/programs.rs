//! The tests that build C++ programs of their own from the emulation and the kernels
//! (ThreadSanitizer, AddressSanitizer and the fiber scheduler's checks), one module per file, in
//! one test binary; `scripts/emu-asan.sh` leaves them out (each builds its sanitizer itself).

mod common;

mod asan;
mod fibers;
mod tsan;
