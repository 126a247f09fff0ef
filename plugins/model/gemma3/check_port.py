"""Checks gemma3_reference.py (the port) against transformers' own Gemma3ForCausalLM.

    check_port.py [TRANSFORMERS_DIR]

Not a ctest: the reference environment's transformers (4.46.3) has no Gemma 3. Run it with a
Python whose transformers is 4.50 or later, or give TRANSFORMERS_DIR, a directory holding an
unpacked transformers wheel (`pip download transformers==4.50.0 --no-deps` and unzip it), which is
put first on sys.path. On the environment's torch 1.13 the few torch 2 names transformers 4.50
imports but the Gemma 3 forward pass never calls (torch.compiler, torch.distributed.tensor) and
its dependency version check are stubbed. For two shapes (the port's own `make` model: 7 layers,
the 5:1 pattern, window 4, linear RoPE scaling 8, tied; and transformers' untied model with a
logit soft-cap, pattern 3 and RoPE bases of its own) it prints the largest relative difference of
the logits, the loss and every gradient between the two implementations.
"""

import json
import os
import subprocess
import sys
import tempfile
import types

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if not hasattr(torch, "compiler"):
    stub = types.ModuleType("torch.compiler")
    stub.is_compiling = lambda: False
    stub.disable = lambda fn=None, recursive=True: fn if fn is not None else (lambda g: g)
    torch.compiler = stub
    sys.modules["torch.compiler"] = stub
sys.modules.setdefault("torch.distributed.tensor", types.ModuleType("torch.distributed.tensor"))
check = types.ModuleType("transformers.dependency_versions_check")
check.dep_version_check = lambda pkg, hint=None: None
sys.modules["transformers.dependency_versions_check"] = check

import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402

PORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemma3_reference.py")


def transformers_run(directory, tokens, targets):
    fields = json.load(open(os.path.join(directory, "config.json")))
    for key in ("architectures", "model_type"):
        fields.pop(key, None)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**fields, attn_implementation="eager"))
    model.eval()
    missing, unexpected = model.load_state_dict(load_file(os.path.join(directory, "model.safetensors")), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), use_cache=False).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    return logits, loss.reshape(1), {n: p.grad for n, p in model.named_parameters()}


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def compare(name, directory, work, tokens, targets):
    logits, loss, grads = transformers_run(directory, tokens, targets)
    out = os.path.join(work, "out.safetensors")
    subprocess.run([sys.executable, PORT, "forward", directory, os.path.join(work, "batch.safetensors"), out],
                   check=True, capture_output=True)
    port = load_file(out)
    worst = max(relative(port["grad." + n], g) for n, g in grads.items())
    print(f"{name}: logits {relative(port['logits'], logits):.2e}  loss {relative(port['loss'], loss):.2e}  "
          f"gradients {worst:.2e} ({len(grads)} parameters)")


def main():
    transformers.logging.set_verbosity_error()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as work:
        g = torch.Generator().manual_seed(5)
        tokens = torch.randint(1, 300, (2, 13), generator=g)
        targets = torch.randint(1, 300, (2, 13), generator=g)
        targets[0, 3] = -1
        save_file({"tokens": tokens.int().contiguous(), "targets": targets.int().contiguous()},
                  os.path.join(work, "batch.safetensors"))
        made = os.path.join(work, "made")
        subprocess.run([sys.executable, PORT, "make", made, "21"], check=True, capture_output=True)
        compare("the port's model (7 layers, pattern 6, window 4, linear RoPE 8, tied)", made, work, tokens, targets)

        config = Gemma3TextConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=32,
                                  sliding_window=3, sliding_window_pattern=3, rope_theta=5000.0,
                                  rope_local_base_freq=100.0, final_logit_softcapping=2.5, tie_word_embeddings=False)
        model = Gemma3ForCausalLM(config)
        torch.manual_seed(3)
        with torch.no_grad():
            for _, p in model.named_parameters():
                p.normal_(0.0, 0.3) if p.dim() == 2 else p.uniform_(-0.5, 0.5)
        theirs = os.path.join(work, "transformers")
        os.makedirs(theirs)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  os.path.join(theirs, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(theirs, "config.json"), "w") as f:
            json.dump(config.to_dict(), f)
        compare("transformers' model (6 layers, pattern 3, soft-cap 2.5, untied)", theirs, work, tokens, targets)


if __name__ == "__main__":
    main()
