"""Reads a directory of TensorBoard event files with the `tensorboard` package, as `tensorboard --logdir`
does, and prints what it found as JSON: the test oracle for hybridflow's TensorBoardWriter.

usage: read_events.py DIR  ->  {"file_version": ..., "files": [...], "scalars": [[tag, step, value]],
                                "texts": [[tag, step, text, html]], "text_plugin_tags": [...],
                                "server_scalars": [[tag, step, value]], "server_text_tags": [...]}
"server_*" is what the TensorBoard server's plugin_event_accumulator sees.
Non-finite values are printed as the strings "nan", "inf", "-inf" (JSON has no NaN).
"""
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader, plugin_event_accumulator
from tensorboard.plugins.text import text_plugin
from tensorboard.util import tensor_util


def number(x):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def main():
    logdir = sys.argv[1]
    files = sorted(f for f in os.listdir(logdir) if "tfevents" in f)
    # Each file's first event must be the version record TensorBoard checks.
    first_events = []
    for f in files:
        loader = event_file_loader.EventFileLoader(os.path.join(logdir, f))
        first = next(iter(loader.Load()))
        first_events.append(first.file_version)
    # size_guidance 0: keep every event (the default samples scalars down to 10,000, tensors to 10).
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={k: 0 for k in event_accumulator.DEFAULT_SIZE_GUIDANCE})
    acc.Reload()
    tags = acc.Tags()
    scalars = [[tag, e.step, number(e.value)] for tag in tags["scalars"] for e in acc.Scalars(tag)]
    texts = []
    for tag in tags["tensors"]:
        for e in acc.Tensors(tag):
            array = tensor_util.make_ndarray(e.tensor_proto)
            # The text plugin's own conversion to HTML, as the Text tab shows it.
            html = text_plugin.text_array_to_html(array, enable_markdown=True)
            texts.append([tag, e.step, array.item().decode("utf-8"), html])
    # The TensorBoard server's own path: plugin_event_accumulator turns simple_value scalars into tensors of
    # the scalars plugin (data_compat), as the Scalars dashboard reads them.
    server = plugin_event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
    server.Reload()
    server_scalars = []
    for tag in server.PluginTagToContent("scalars"):
        for e in server.Tensors(tag):
            server_scalars.append([tag, e.step, number(float(tensor_util.make_ndarray(e.tensor_proto).item()))])
    print(json.dumps({
        "files": files,
        "file_versions": first_events,
        "scalars": scalars,
        "texts": texts,
        "text_plugin_tags": sorted(acc.PluginTagToContent("text").keys()),
        "server_scalars": server_scalars,
        "server_text_tags": sorted(server.PluginTagToContent("text").keys()),
    }))


if __name__ == "__main__":
    main()
