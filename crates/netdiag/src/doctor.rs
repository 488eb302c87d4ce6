//! Checks (written next).
