//! Derive macros for gpumem-array (placeholder until the derive lands).
