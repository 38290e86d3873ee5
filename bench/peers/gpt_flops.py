"""FLOPs and parameter counts of the benchmark presets, shared by the peers (torch_gpt.py, llmc_gpt.py).

The same formulas as GPTConfig::flops_per_token and GPTConfig::num_parameters (docs/flops.md), so every
row of bench_train, the PyTorch peer and llm.c counts a step's work the same way.
"""


def flops_per_token(L, C, T, V, family="gpt2", NH=1, G=0, Fd=0):
    """GPTConfig::flops_per_token (docs/flops.md): 6 * N_matmul + 6 * L * T * C, N_matmul with the head."""
    if family == "llama":
        HD = C // NH
        matmul = L * ((NH + 2 * G) * HD * C + C * NH * HD + 2 * Fd * C + C * Fd) + V * C
    else:
        Fd = 4 * C
        matmul = L * (3 * C * C + C * C + 2 * C * Fd) + V * C
    return 6.0 * matmul + 6.0 * L * T * C


def num_parameters(L, C, V, P, family="gpt2", NH=1, G=0, Fd=0):
    """GPTConfig::num_parameters (the tied head counts once; Llama: no wpe, no biases, own head)."""
    if family == "llama":
        HD = C // NH
        per_layer = C + (NH + 2 * G) * HD * C + C * NH * HD + C + 2 * Fd * C + C * Fd
        return V * C + L * per_layer + C + V * C
    Fd = 4 * C
    per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + Fd * C + Fd + C * Fd + C
    return V * C + P * C + L * per_layer + 2 * C
