"""Reads a TensorBoard log directory the way `tensorboard --logdir` does (its plugin event
accumulator, which also checks every record's CRCs and applies SessionLog START purges) and prints
the scalars and text samples as JSON: {"scalars": {tag: [[step, value], ...]}, "text": {tag:
[[step, text], ...]}}. tensorboard_test.cpp runs it on what the `tensorboard` tracker wrote."""
import json
import sys

from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.util import tensor_util

acc = pea.EventAccumulator(sys.argv[1], size_guidance={pea.TENSORS: 0})
acc.Reload()
out = {"scalars": {}, "text": {}}
for tag in acc.Tags()["tensors"]:
    plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
    events = acc.Tensors(tag)
    if plugin == "scalars":
        out["scalars"][tag] = [[e.step, float(tensor_util.make_ndarray(e.tensor_proto))] for e in events]
    elif plugin == "text":
        out["text"][tag] = [[e.step, e.tensor_proto.string_val[0].decode("utf-8")] for e in events]
print(json.dumps(out))
