"""Phase 1: the attention-numerics microbenchmark."""
