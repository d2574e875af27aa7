"""The project's own kernels, installed as numdev.kernels: the Triton FlashAttention kernel (GPU,
and CPU through Triton's interpreter) and the flash emulator's fused C kernels (CPU,
flash_emulator.c, built and loaded by numdev.attention.native)."""
