"""PEFT's side of loom's LoRA test (peft_test.cpp).

For each case directory under WORK (gpt2, llama): base/ is the base model exported by
`loom export` (for a run with a quantized base, lora.base_dtype, the run's stored base
dequantized, with the float32 model it came from in base_f32/), adapters/ the run's adapters as `loom export` writes them (PEFT's
adapter_model.safetensors and adapter_config.json), merged/ the model with the adapters merged
(`loom export --merge-lora`). Loads base + adapters with peft.PeftModel.from_pretrained and the
merged model with transformers, computes the logits of tokens.safetensors' "tokens" with each,
and writes them to peft.safetensors ("peft_logits", "merged_logits", and the base model's
"base_logits"), with peft.json reporting
how many LoRA modules PEFT built and whether every adapter tensor of the file reached them.

Exits 77 when peft or transformers cannot be imported.
"""
import json
import os
import sys

try:
    import torch
    import transformers
    import peft
    from safetensors.torch import load_file, save_file
except Exception as e:  # noqa: BLE001
    print(f"peft is not available: {e}", file=sys.stderr)
    sys.exit(77)


def run(case):
    tokens = load_file(os.path.join(case, "tokens.safetensors"))["tokens"].long()
    base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(case, "base"), torch_dtype=torch.float32)
    base.eval()
    with torch.no_grad():
        base_logits = base(tokens).logits
    model = peft.PeftModel.from_pretrained(base, os.path.join(case, "adapters"))
    model.eval()
    saved = load_file(os.path.join(case, "adapters", "adapter_model.safetensors"))
    state = model.state_dict()
    modules = 0
    reached = True
    for name, value in saved.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        if key not in state or not torch.equal(state[key], value):
            print(f"{name} did not reach the model ({key})", file=sys.stderr)
            reached = False
    for _, module in model.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            modules += 1
    with torch.no_grad():
        peft_logits = model(tokens).logits
    merged = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(case, "merged"), torch_dtype=torch.float32)
    merged.eval()
    with torch.no_grad():
        merged_logits = merged(tokens).logits
    logits = {"peft_logits": peft_logits.contiguous(), "merged_logits": merged_logits.contiguous(),
              "base_logits": base_logits.contiguous()}
    # A quantized-base case (lora.base_dtype): base/ is the run's dequantized base, base_f32/ the
    # float32 model it was quantized from; the same adapters over the latter, for contrast.
    if os.path.isdir(os.path.join(case, "base_f32")):
        f32 = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(case, "base_f32"),
                                                                torch_dtype=torch.float32)
        f32 = peft.PeftModel.from_pretrained(f32, os.path.join(case, "adapters"))
        f32.eval()
        with torch.no_grad():
            logits["peft_f32_base_logits"] = f32(tokens).logits.contiguous()
    save_file(logits, os.path.join(case, "peft.safetensors"))
    with open(os.path.join(case, "peft.json"), "w") as f:
        json.dump({"lora_modules": modules, "tensors": len(saved), "reached": reached}, f)


def main():
    work = sys.argv[1]
    for case in sorted(os.listdir(work)):
        path = os.path.join(work, case)
        if os.path.isdir(path) and os.path.exists(os.path.join(path, "tokens.safetensors")):
            run(path)


if __name__ == "__main__":
    main()
