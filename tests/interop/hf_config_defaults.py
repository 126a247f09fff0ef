"""transformers' side of hf_config_defaults_test.cpp: what a config.json with a field left out means.

    hf_config_defaults.py WORK

WORK/<case>/<field>/config.json is a config.json loom exported for <case> with <field> removed.
Each is read as from_pretrained reads it (AutoConfig.from_pretrained: the config class of its
model_type, every absent field at that class's default or derived from the other fields), and
the value the field then has is written to WORK/expected.json: {"<case>": {"<field>": value}}.

A field the config class leaves at None for the model to derive is given as the modeling code
derives it (GPT-2's n_inner: 4 * n_embd).

A case whose model_type this transformers does not know (qwen3 before 4.51) is left out of
expected.json and named, with the reason, under "skipped" there.

Exits 77 when transformers cannot be imported.
"""
import json
import os
import sys

try:
    import transformers
except Exception as e:  # noqa: BLE001
    print(f"transformers is not available: {e}", file=sys.stderr)
    sys.exit(77)


def main():
    work = sys.argv[1]
    expected = {}
    skipped = {}
    for case in sorted(os.listdir(work)):
        case_dir = os.path.join(work, case)
        if not os.path.isdir(case_dir):
            continue
        fields = {}
        for field in sorted(os.listdir(case_dir)):
            path = os.path.join(case_dir, field)
            if not os.path.exists(os.path.join(path, "config.json")):
                continue
            with open(os.path.join(path, "config.json")) as f:
                model_type = json.load(f).get("model_type")
            if model_type not in transformers.CONFIG_MAPPING:
                skipped[case] = f"transformers {transformers.__version__} has no model_type {model_type!r}"
                break
            config = transformers.AutoConfig.from_pretrained(path)
            value = getattr(config, field)
            if field == "n_inner" and value is None:  # modeling_gpt2: config.n_inner or 4 * hidden_size
                value = 4 * config.n_embd
            fields[field] = value if value is None or isinstance(value, (bool, int, float, str, dict, list)) else str(value)
        if case not in skipped:
            expected[case] = fields
    with open(os.path.join(work, "expected.json"), "w") as f:
        json.dump(dict(expected, skipped=skipped), f, indent=1, sort_keys=True)
    print(f"transformers {transformers.__version__}: {sum(len(v) for v in expected.values())} fields of "
          f"{len(expected)} configs")
    for case, why in skipped.items():
        print(f"skipped {case}: {why}")


if __name__ == "__main__":
    main()
