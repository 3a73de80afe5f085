//! emu-sim
