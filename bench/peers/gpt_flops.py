"""FLOPs and parameter counts of the benchmark presets, shared by the peers (torch_gpt.py, llmc_gpt.py).

The same formulas as GPTConfig::flops_per_token and GPTConfig::num_parameters (docs/flops.md), so every
row of bench_train, the PyTorch peer and llm.c counts a step's work the same way.
"""


def moe_mlp_counts(C, E, k, Fe):
    """An MoE MLP of E SwiGLU experts of width Fe, top-k, bias-free: (every parameter, active matmul parameters).

    The router (E, C) and each expert's gate|up (2Fe, C) and down (C, Fe); a token runs through the router and
    k of the E experts (docs/flops.md "Mixture of Experts: active, not total")."""
    expert = 2 * Fe * C + C * Fe
    return E * C + E * expert, E * C + k * expert


def flops_per_token(L, C, T, V, family="gpt2", NH=1, G=0, Fd=0, E=0, k=0, Fe=0):
    """GPTConfig::flops_per_token (docs/flops.md): 6 * N_matmul + 6 * L * T * C, N_matmul with the head.

    family "moe" (mixtral): the Llama layer with its MLP an MoE (E, k, Fe), counted active (router + k experts)."""
    if family == "moe":
        HD = C // NH
        matmul = L * ((NH + 2 * G) * HD * C + C * NH * HD + moe_mlp_counts(C, E, k, Fe)[1]) + V * C
    elif family == "llama":
        HD = C // NH
        matmul = L * ((NH + 2 * G) * HD * C + C * NH * HD + 2 * Fd * C + C * Fd) + V * C
    else:
        Fd = 4 * C
        matmul = L * (3 * C * C + C * C + 2 * C * Fd) + V * C
    return 6.0 * matmul + 6.0 * L * T * C


def num_parameters(L, C, V, P, family="gpt2", NH=1, G=0, Fd=0, E=0, k=0, Fe=0):
    """GPTConfig::num_parameters (the tied head counts once; Llama: no wpe, no biases, own head; MoE: every expert)."""
    if family == "moe":
        HD = C // NH
        per_layer = C + (NH + 2 * G) * HD * C + C * NH * HD + C + moe_mlp_counts(C, E, k, Fe)[0]
        return V * C + L * per_layer + C + V * C
    if family == "llama":
        HD = C // NH
        per_layer = C + (NH + 2 * G) * HD * C + C * NH * HD + C + 2 * Fd * C + C * Fd
        return V * C + L * per_layer + C + V * C
    Fd = 4 * C
    per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + Fd * C + Fd + C * Fd + C
    return V * C + P * C + L * per_layer + 2 * C
