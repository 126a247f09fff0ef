#!/usr/bin/python3
"""A hand-written PyTorch DPO loss on a tiny GPT-2, for loom's dpo objective (dpo_agreement_test).

Usage: reference_dpo.py OUT_DIR

Writes OUT_DIR/dpo.weights.safetensors (the policy), dpo.reference.safetensors (the frozen
reference: the policy's weights perturbed, so that the two differ) and dpo.data.safetensors:
input.tokens / input.targets (rows in (chosen, rejected) pairs, -1 on the prompt and padding),
expected.loss, expected.metrics [accuracy, margin, chosen reward, rejected reward] and grad.<name>
of every policy parameter. The loss is Rafailov et al. 2023, eq. 7, with conservative label
smoothing eps (Mitchell 2023):
    z = beta * ((log p_c - log ref_c) - (log p_r - log ref_r))
    loss = mean over pairs of -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)
with log p a response's summed token log-probabilities. The model is reference_models.gpt2_logits.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_models import VOCAB, gpt2_logits, gpt2_weights, normal, write_safetensors  # noqa: E402

BETA = 0.5
LABEL_SMOOTHING = 0.1
CFG = dict(type="gpt2", seq_len=16, hidden_dim=32, num_layers=2, num_heads=4, vocab_size=VOCAB)


def sequence_log_probs(weights, tokens, targets):
    logits = gpt2_logits(weights, CFG, tokens, None)
    nll = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1).long(), ignore_index=-1,
                          reduction="none").reshape(targets.shape)
    return -(nll * (targets >= 0)).sum(dim=1)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(2024)
    policy = gpt2_weights(CFG, VOCAB, gen)
    reference = {n: t + normal(t.shape, 0.05, gen) for n, t in policy.items()}
    pairs, T = 3, 13
    tokens = torch.randint(0, VOCAB, (2 * pairs, T), generator=gen, dtype=torch.int32)
    targets = torch.randint(0, VOCAB, (2 * pairs, T), generator=gen, dtype=torch.int32)
    for r in range(2 * pairs):
        prompt = 2 + (r // 2) % 3       # the same prompt length in both rows of a pair
        pad = (r * 5) % 4               # responses of different lengths, padding after them
        targets[r, :prompt] = -1
        if r % 2:
            tokens[r, :prompt] = tokens[r - 1, :prompt]  # one prompt per pair
        if pad:
            targets[r, T - pad:] = -1
    for t in policy.values():
        t.requires_grad_(True)
    with torch.no_grad():
        ref_logp = sequence_log_probs(reference, tokens, targets)
    logp = sequence_log_probs(policy, tokens, targets)
    chosen = BETA * (logp[0::2] - ref_logp[0::2])
    rejected = BETA * (logp[1::2] - ref_logp[1::2])
    z = chosen - rejected
    loss = (-(1 - LABEL_SMOOTHING) * F.logsigmoid(z) - LABEL_SMOOTHING * F.logsigmoid(-z)).mean()
    loss.backward()
    metrics = torch.stack([(z > 0).float().mean(), z.mean(), chosen.mean(), rejected.mean()]).detach()

    meta = {"model": json.dumps(CFG), "beta": str(BETA), "label_smoothing": str(LABEL_SMOOTHING)}
    write_safetensors(os.path.join(out_dir, "dpo.weights.safetensors"), sorted(policy.items()), meta)
    write_safetensors(os.path.join(out_dir, "dpo.reference.safetensors"), sorted(reference.items()), meta)
    data = [("input.tokens", tokens), ("input.targets", targets), ("expected.loss", loss.detach().reshape(())),
            ("expected.metrics", metrics)]
    data += [("grad." + n, t.grad) for n, t in sorted(policy.items())]
    write_safetensors(os.path.join(out_dir, "dpo.data.safetensors"), data, meta)


if __name__ == "__main__":
    main()
