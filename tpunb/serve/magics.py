"""%tpu_bench: parse the line, make one call into ``tpunb.serve.bench``, show the table (and a
plot of latency against throughput for a sweep)."""
from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from tpunb import report
from tpunb.magics import one_line_interrupt, parse_line


@magics_class
class BenchMagics(Magics):
    """Benchmarks of what a slice serves."""

    @magic_arguments()
    @argument("target", help="a service of the current slice, HOST:PORT or a base URL")
    @argument("--model", default=None, metavar="M", help="the model to ask for (default: the first the server lists)")
    @argument("--requests", type=int, default=100, metavar="N", help="requests per concurrency level")
    @argument("--concurrency", default="1", metavar="C[,C...]", help="requests at once; a list is a sweep")
    @argument("--request-rate", type=float, default=None, metavar="R", help="Poisson arrivals, R a second (default: all at once)")
    @argument("--input-len", type=int, default=128, metavar="L", help="prompt tokens")
    @argument("--output-len", type=int, default=128, metavar="L", help="tokens to generate (end-of-sequence ignored)")
    @argument("--tokenizer", default=None, metavar="PATH", help="counts input tokens (default: the server's /tokenize)")
    @argument("--chat", action="store_true", help="/v1/chat/completions instead of /v1/completions")
    @argument("--save", default=None, metavar="FILE", help="the figures as JSON, with vllm bench serve's key names")
    @argument("--on-host", action="store_true", help="run the client on the service's host")
    @argument("--host", default=None, metavar="N", help="the service's host (default: the lowest that runs it)")
    @argument("--timeout", type=float, default=300.0, metavar="S", help="seconds a request may take")
    @argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos / min_tokens")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_bench(self, line: str):
        """Benchmark an OpenAI-compatible server: %tpu_bench TARGET [--requests N] [--concurrency 1,16,64]
        [--input-len L] [--output-len L] [--chat] [--save FILE] [--on-host]."""
        from IPython.display import display

        from tpunb.serve.bench import bench_serving

        args = parse_line(self.tpu_bench, line)
        with one_line_interrupt():
            result = bench_serving(args.target, model=args.model, requests=args.requests,
                                   concurrency=args.concurrency, request_rate=args.request_rate,
                                   input_len=args.input_len, output_len=args.output_len, tokenizer=args.tokenizer,
                                   chat=args.chat, save=args.save, on_host=args.on_host, host=args.host,
                                   timeout=args.timeout, ignore_eos=not args.no_ignore_eos,
                                   slice_name=args.slice_name)
        where = "on its host" if result.on_host else f"from this kernel, round trip {_ms(result.rtt_ms)}"
        report.info(f"[tpunb] {result.model} at {result.target}, {where}" +
                    (f"; saved to {args.save}" if args.save else ""))
        if result.failures_line():
            report.warn(f"[tpunb] {result.failures_line()}")
        display(result.frame())
        if len(result.levels) > 1 and result.plot() is None:
            report.info("[tpunb] no plot: matplotlib is not installed (pip install matplotlib)")


def _ms(value: float | None) -> str:
    return "unmeasured" if value is None else f"{value:.2f} ms"
