"""%tpu_bench: parse the line, make one call into ``tpunb.bench``, show the table (and a
plot of latency against throughput for a sweep)."""
from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from tpunb import manager, report
from tpunb.magics.args import one_line_interrupt, parse_line


@magics_class
class BenchMagics(Magics):
    """Benchmarks of what a slice serves."""

    @magic_arguments()
    @argument("target", help="a service of the current slice, HOST:PORT or a base URL")
    @argument("--model", default=None, metavar="M", help="the model to ask for (default: the first the server lists)")
    @argument("--requests", type=int, default=100, metavar="N", help="requests per level (vllm's --num-prompts)")
    @argument("--concurrency", default=None, metavar="C[,C...]",
              help="requests at once (vllm's --max-concurrency); a list is a sweep (default: 1, or no cap with "
                   "--request-rate)")
    @argument("--request-rate", type=float, default=None, metavar="R", help="arrivals a second (default: all at once)")
    @argument("--burstiness", type=float, default=1.0, metavar="B", help="gamma shape of the arrivals (1: Poisson)")
    @argument("--input-len", type=int, default=128, metavar="L", help="prompt tokens")
    @argument("--output-len", type=int, default=None, metavar="L",
              help="tokens to generate, end-of-sequence ignored (default 128; with --dataset, each answer's)")
    @argument("--prefix-len", type=int, default=0, metavar="L", help="tokens every prompt of a level shares")
    @argument("--seed", type=int, default=0, help="level k draws its prompts from SEED + k")
    @argument("--num-warmups", type=int, default=0, metavar="N", help="requests before each level, not measured")
    @argument("--dataset", default=None, metavar="FILE", help="prompts from a ShareGPT-format JSON file")
    @argument("--tokenizer", default=None, metavar="PATH", help="makes and counts tokens (default: the server's /tokenize)")
    @argument("--temperature", type=float, default=None, metavar="T", help="sampling temperature (default: the server's)")
    @argument("--goodput", nargs="+", default=None, metavar="KEY:MS", help="limits a good request keeps: ttft:MS tpot:MS e2el:MS")
    @argument("--chat", action="store_true", help="/v1/chat/completions instead of /v1/completions")
    @argument("--save", default=None, metavar="PATH", help="vllm's result JSON; for a sweep, vllm bench sweep's folder")
    @argument("--on-host", action="store_true", help="run the client on the service's host (the default for a service)")
    @argument("--from-kernel", action="store_true", help="run the client here: the round trip is then in each TTFT")
    @argument("--host", default=None, metavar="N", help="the service's host (default: the lowest that runs it)")
    @argument("--timeout", type=float, default=300.0, metavar="S", help="seconds a request may take")
    @argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos / min_tokens")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_bench(self, line: str):
        """Benchmark an OpenAI-compatible server: %tpu_bench TARGET [--requests N] [--concurrency 1,16,64]
        [--request-rate R] [--input-len L] [--output-len L] [--chat] [--save PATH]."""
        from IPython.display import display

        from tpunb.errors import UsageError
        from tpunb.bench import bench_serving

        args = parse_line(self.tpu_bench, line)
        if args.on_host and args.from_kernel:
            raise UsageError("--on-host and --from-kernel pick opposite places for the client: give one")
        on_host = True if args.on_host else False if args.from_kernel else None
        with one_line_interrupt():
            result = bench_serving(args.target, model=args.model, requests=args.requests,
                                   concurrency=args.concurrency, request_rate=args.request_rate,
                                   input_len=args.input_len, output_len=args.output_len, tokenizer=args.tokenizer,
                                   chat=args.chat, save=args.save, on_host=on_host, host=args.host,
                                   timeout=args.timeout, ignore_eos=not args.no_ignore_eos,
                                   slice_name=args.slice_name, seed=args.seed, prefix_len=args.prefix_len,
                                   num_warmups=args.num_warmups, burstiness=args.burstiness, goodput=args.goodput,
                                   temperature=args.temperature, dataset=args.dataset,
                                   current=manager.current)
        where = ("on its host (no network path in the figures)" if result.on_host else
                 f"from this kernel: round trip {_ms(result.rtt_ms)}, in every TTFT and E2EL")
        report.info(f"[tpunb] {result.model} at {result.target}, {where}" +
                    (f"; saved to {args.save}" if args.save else ""))
        if result.failures_line():
            report.warn(f"[tpunb] {result.failures_line()}")
        display(result.frame())
        if len(result.levels) > 1 and result.plot() is None:
            report.info("[tpunb] no plot: matplotlib is not installed (pip install matplotlib)")


def _ms(value: float | None) -> str:
    return "unmeasured" if value is None else f"{value:.2f} ms"
