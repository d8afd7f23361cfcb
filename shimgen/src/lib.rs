//! Build-time generator (placeholder until written).
