"""One prefill for every press against kvpress's pipeline run press by press, on Gemma 3 270M (kvpress venv).

    .venv-kvpress/bin/python benchmarks/bench_oneprefill.py [--tokens 1400] [--threads 1]

Needs the converted Gemma 3 270M in the attsvm cache (``load_model("gemma3-270m")`` once in the main venv with
the ``[llm]`` extra). Prints both wall times, their ratio (same run), and whether every method's answer agrees.

A full run (the default --tokens) writes its table to benchmarks/records/ (``--record`` records any run,
``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import time

from _record import Recorder, add_option, wanted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1400, help="context length in tokens (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1)
    add_option(ap, "the default --tokens")
    args = ap.parse_args()
    rec = Recorder("bench_oneprefill", wanted(args, ap, ("tokens",)))
    import torch

    torch.set_num_threads(args.threads)
    import kvpress  # noqa: F401  (registers the pipeline)
    from kvpress import KeyDiffPress, KnormPress, SnapKVPress, StreamingLLMPress, TOVAPress
    from kvpress.pipeline import KVPressTextGenerationPipeline

    from attsvm.analysis import load_model
    from attsvm.analysis._models import corpus_topics
    from attsvm.analysis.kv_oneprefill import answers_one_prefill
    from attsvm.integrations.kvpress import H2OPress, HybridPress, SVMarginPress

    model, tok = load_model("gemma3-270m", causal_lm=True)
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tok)
    text = "\n\n".join(corpus_topics().values())
    ctx = tok(text, return_tensors="pt")["input_ids"][:, : args.tokens]
    q = tok("\nQuestion: what is this text about?\nAnswer:", add_special_tokens=False, return_tensors="pt")["input_ids"]
    makes = {
        "full": None,
        "knorm": lambda: KnormPress(0.5),
        "snapkv": lambda: SnapKVPress(0.5),
        "tova": lambda: TOVAPress(0.5),
        "streaming_llm": lambda: StreamingLLMPress(0.5),
        "keydiff": lambda: KeyDiffPress(0.5),
        "svm_margin": lambda: SVMarginPress(0.5),
        "h2o": lambda: H2OPress(0.5),
    }
    t0 = time.perf_counter()
    ours = answers_one_prefill(model, ctx, [q], {n: None if m is None else HybridPress(m()) for n, m in makes.items()})
    t_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    agree = 0
    for name, make in makes.items():
        press = None if make is None else HybridPress(make())
        ref = pipe._forward({"context_ids": ctx, "questions_ids": [q]}, max_new_tokens=8, press=press)[0]
        agree += ref == tok.decode(torch.tensor(ours[name][0]), skip_special_tokens=True)
    t_each = time.perf_counter() - t0
    print(
        f"{len(makes)} methods, {ctx.shape[1]} tokens: one prefill {t_one:.1f} s, press by press {t_each:.1f} s, "
        f"ratio {t_each / t_one:.2f}x; answers equal for {agree}/{len(makes)}"
    )
    rec.table(
        "One prefill for every press against kvpress's pipeline, press by press",
        ["model", "methods", "tokens", "one prefill (s)", "press by press (s)", "ratio", "answers equal"],
        [["Gemma 3 270M", len(makes), ctx.shape[1], round(t_one, 1), round(t_each, 1), f"{t_each / t_one:.2f}×",
          f"{agree}/{len(makes)}"]],
        [f"methods: {', '.join(makes)}; compression ratio 0.5", f"{args.threads} thread(s), 8 new tokens per answer"],
    )  # fmt: skip
    rec.write()


if __name__ == "__main__":
    main()
