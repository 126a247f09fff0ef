"""lm-evaluation-harness's own scores of a Hugging Face model on loom's task files.

    python harness_reference.py HF_DIR TASK_DIR OUT.json [--batch-size B] [--tasks a,b] [--num-fewshot K]

TASK_DIR holds hellaswag.jsonl, arc_easy.jsonl, arc_challenge.jsonl, piqa.jsonl, winogrande.jsonl,
mmlu.jsonl (subject "anatomy"), lambada.jsonl, my_task.jsonl (generic multiple choice),
my_task_glued.jsonl (the same, with target_delimiter "") and perplexity.jsonl ({"text"} lines), in the harness's field names. Each is run through the
harness's own task YAML (included, so its prompts, delimiters and preprocessing are the
harness's) with the data read from the local file, by simple_evaluate with the transformers
backend (HFLM) on the CPU in float32. Writes {task: {"metrics": {...}, "docs": [[[ll, greedy],
...] per document, in file order], "seconds": s}}. With --num-fewshot K each document is preceded by K
examples, drawn by the harness's own samplers (fewshot_random_seed 1234) from the same file (its
YAML's fewshot_split is null, so the examples come from the validation split, which is the file).
Exits 77, saying why, when lm_eval is missing.
"""
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import lm_eval
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
except Exception as e:  # noqa: BLE001 - any import failure means the harness cannot run here
    print(f"lm-evaluation-harness is not available: {type(e).__name__}: {e} "
          "(scripts/setup-python-env.sh installs lm-eval==0.4.5)", file=sys.stderr)
    sys.exit(77)

# loom task -> (the harness's YAML it includes, the splits that YAML reads)
HARNESS_TASKS = {
    "hellaswag": "hellaswag/hellaswag.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "piqa": "piqa/piqa.yaml",
    "winogrande": "winogrande/default.yaml",
    "mmlu": "mmlu/default/mmlu_anatomy.yaml",
    "lambada": "lambada/lambada_openai.yaml",
}


def task_yaml(name, data_file, tasks_root):
    data = json.dumps({"validation": data_file, "test": data_file})
    if name in HARNESS_TASKS:
        return (f"include: {os.path.join(tasks_root, HARNESS_TASKS[name])}\n"
                f"task: loom_{name}\ntag: []\ndataset_path: json\ndataset_name: null\n"
                f"dataset_kwargs: {{data_files: {data}}}\n"
                "training_split: null\nfewshot_split: null\n")
    if name in ("my_task", "my_task_glued"):
        return (f"task: loom_{name}\ndataset_path: json\ndataset_kwargs: {{data_files: {data}}}\n"
                "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
                "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{label}}\"\n"
                + ("target_delimiter: \"\"\n" if name == "my_task_glued" else "")
                + "metric_list: [{metric: acc}, {metric: acc_norm}]\n")
    if name == "perplexity":
        return (f"task: loom_{name}\ndataset_path: json\ndataset_kwargs: {{data_files: {data}}}\n"
                "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
                "doc_to_target: \"{{text}}\"\n"
                "metric_list: [{metric: word_perplexity}, {metric: byte_perplexity}, {metric: bits_per_byte}]\n")
    raise SystemExit(f"unknown task {name}")


def main():
    args = sys.argv[1:]
    batch_size = 8
    only = None
    if "--batch-size" in args:
        i = args.index("--batch-size")
        batch_size = int(args[i + 1])
        del args[i:i + 2]
    num_fewshot = 0
    if "--num-fewshot" in args:
        i = args.index("--num-fewshot")
        num_fewshot = int(args[i + 1])
        del args[i:i + 2]
    if "--tasks" in args:
        i = args.index("--tasks")
        only = args[i + 1].split(",")
        del args[i:i + 2]
    hf_dir, task_dir, out_file = args
    tasks_root = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
    names = [n for n in list(HARNESS_TASKS) + ["my_task", "my_task_glued", "perplexity"]
             if os.path.exists(os.path.join(task_dir, n + ".jsonl")) and (only is None or n in only)]
    lm = HFLM(pretrained=hf_dir, device="cpu", batch_size=batch_size, dtype="float32")
    out = {"lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?"}
    with tempfile.TemporaryDirectory() as yaml_dir:
        for name in names:
            with open(os.path.join(yaml_dir, f"loom_{name}.yaml"), "w") as f:
                f.write(task_yaml(name, os.path.abspath(os.path.join(task_dir, name + ".jsonl")), tasks_root))
        manager = TaskManager(include_path=yaml_dir, include_defaults=False)
        for name in names:
            start = time.perf_counter()
            result = simple_evaluate(model=lm, tasks=[f"loom_{name}"], task_manager=manager, log_samples=True,
                                     bootstrap_iters=100000, num_fewshot=num_fewshot)
            seconds = time.perf_counter() - start
            task = f"loom_{name}"
            metrics = {k.split(",")[0]: v for k, v in result["results"][task].items() if k != "alias"}
            docs = []
            for sample in sorted(result["samples"][task], key=lambda s: s["doc_id"]):
                doc = []
                for resp in sample["resps"]:
                    r = resp[0]
                    doc.append([float(r), False] if not isinstance(r, (tuple, list)) else [float(r[0]), bool(r[1])])
                docs.append(doc)
            out[name] = {"metrics": metrics, "docs": docs, "seconds": seconds}
    with open(out_file, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
