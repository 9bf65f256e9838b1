"""The slice magics (%tpu_launch, %%on_tpu, %tpu_push ...): parse the arguments, make one call into
the Python API, render the answer."""
from __future__ import annotations

import argparse
import contextlib

from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from tpunb import provision, report, manager
from tpunb.display import MODES, render_values
from tpunb.errors import CellInterrupted, UsageError
from tpunb.magics.args import cloud_arguments, one_line_interrupt, parse_line, usage_of
from tpunb.secrets import policy
from tpunb.services import seen
from tpunb.snapshot import preempt


@magics_class
class TpuMagics(Magics):
    @magic_arguments()
    @argument("accelerator", nargs="?", default=None,
              help="accelerator type, e.g. v4-16, v5litepod-8, v6e-16; or local: this machine's own TPU (Colab)")
    @argument("--name", help="slice name (default: the accelerator type)")
    @argument("--backend", choices=manager.BACKENDS,
              help="gcp (Cloud TPU) when a project is configured, else local (simulated here)")
    @argument("--slices", type=int, default=None, metavar="N",
              help="a multislice: N slices of ACCELERATOR joined in one JAX job (Cloud TPU: one queued resource)")
    @argument("--env", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help=policy.ENV_HELP.replace("%", "%%"))
    @argument("--secret", nargs="+", action="extend", default=[], metavar="NAME", help=policy.SECRET_HELP.replace("%", "%%"))
    @argument("--compile-cache", metavar="gs://BUCKET/PATH", default=None,
              help="JAX's compilation cache in Cloud Storage, shared by every slice given it (default: on each "
                   "host's disk); whoever can write there can run code on the hosts")
    @cloud_arguments
    @argument("--no-hf-token", action="store_true", help="keep this kernel's HF_TOKEN from the hosts (sent as a secret by default)")
    @argument("--recover", metavar="NAME", help="relaunch a preempted slice with the spec it had (and restore its last snapshot)")
    @argument("--snapshot-on-preempt", metavar="NAME[,NAME]", default=None,
              help="every host snapshots these variables when its VM gets the preemption notice (see %%tpu_snapshot)")
    @line_magic
    def tpu_launch(self, line: str):
        """Launch a slice and connect to every host: %tpu_launch v4-16 [--spot] [--zone Z|Z1,Z2|any] [--race N] ..."""
        try:  # a press while the line is parsed has made nothing either
            args = parse_line(self.tpu_launch, line)
            backend, cloud = provision.launch_options(vars(args), args.backend)
            if bool(args.recover) == bool(args.accelerator):
                raise UsageError("give an ACCELERATOR (e.g. v4-16), or --recover NAME (which reuses the recorded one). "
                                 f"Usage: {usage_of(self.tpu_launch)}")
            armed = preempt.names_list(args.snapshot_on_preempt)
            sl = manager.launch(args.accelerator, name=args.name, backend=backend, env=args.env,
                               recover=args.recover, slices=args.slices, compile_cache=args.compile_cache,
                               secrets=args.secret, hf_token=not args.no_hf_token, **cloud)
        except KeyboardInterrupt:  # before the launch made anything (after, it says so itself)
            raise CellInterrupted("%tpu_launch interrupted before it started anything: nothing is left running") \
                from None
        with one_line_interrupt():
            preempt.after_launch(sl, args.recover, armed)

    @magic_arguments()
    @argument("--hosts", default=None, help="all (default), 0, 0,2 or 1:3 (Python slice); in a multislice also "
                                            "s1 (slice 1), s1/0 (its host 0), s*/0 (host 0 of every slice)")
    @argument("--timeout", type=float, default=None, help="interrupt the cell on every host after S seconds")
    @argument("--output", choices=MODES, default="grouped", help="grouped: identical lines once; all; first")
    @argument("--slice", dest="slice_name", default=None, help="run on this slice instead of the current one")
    @argument("--bg", action="store_true",
              help="in the background: returns at once with a handle (tpunb.last_run()); output still streams here")
    @argument("--queue", action="store_true", help="wait for a background cell on these hosts instead of refusing")
    @cell_magic
    def on_tpu(self, line: str, cell: str):
        """Run the cell on every host of the slice at once."""
        args = parse_line(self.on_tpu, line)
        sl = manager.current(args.slice_name)
        if not cell.strip():
            return
        if args.bg:
            return sl.run(cell, hosts=args.hosts, timeout=args.timeout, output=args.output, background=True,
                          queue=args.queue)
        with one_line_interrupt():
            result = sl.run(cell, hosts=args.hosts, timeout=args.timeout, output=args.output, queue=args.queue)
            render_values(result, args.output, sl.num_hosts, names=sl.layout.names)
        result.raise_for_status()

    @magic_arguments()
    @argument("hosts", help="HOST[,HOST...], each [user@]host[:port]; host index follows this order")
    @argument("--user", default=None, help="login user (default: yours)")
    @argument("--key", default=None, help="private key (default: tpunb's own ed25519 key under $TPUNB_HOME/keys)")
    @argument("--port", type=int, default=22)
    @argument("--name", default=None, help="slice name")
    @argument("--env", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help=policy.ENV_HELP.replace("%", "%%"))
    @argument("--secret", nargs="+", action="extend", default=[], metavar="NAME", help=policy.SECRET_HELP.replace("%", "%%"))
    @argument("--python", default="python3", help="Python >= 3.10 on the hosts (or A,B,... one per host); with "
                                                  "--setup, X.Y for the environment it makes (default: this notebook's)")
    @argument("--setup", action="store_true", help="make (or check) an environment on each host as a cloud slice "
                                                   "gets: uv venv, this notebook's Python and jax, flax, ...")
    @argument("--jax", default=None, help="with --setup: the jax version (default: this notebook's)")
    @argument("--pip", default=None, metavar="\"PKG ...\"", help="with --setup: more packages")
    @argument("--requirements", default=None, metavar="FILE", help="with --setup: a requirements file on this machine")
    @argument("--coordinator-port", type=int, default=None,
              help="JAX's coordinator port on host 0, fixed (default: random); 8476 passes GCP's TPU firewall rule")
    @argument("--accelerator", default=None, help="what the hosts are (e.g. v4-16), for status and JAX")
    @argument("--accept-new-host-key", action="store_true", help="the hosts were re-created: record their new keys")
    @argument("--slices", type=int, default=None, help="the hosts are N equal slices of a multislice, slice by slice")
    @line_magic
    def tpu_connect(self, line: str):
        """Make a slice of hosts you bring, over SSH: %tpu_connect 10.0.0.2,10.0.0.3 --user me."""
        try:  # a press while the line is parsed has made nothing either
            args = parse_line(self.tpu_connect, line)
            manager.connect(args.hosts, user=args.user, key=args.key, port=args.port, name=args.name, env=args.env,
                            secrets=args.secret, python=args.python, accelerator=args.accelerator,
                           accept_new_host_key=args.accept_new_host_key, slices=args.slices,
                           coordinator_port=args.coordinator_port, setup=args.setup, jax=args.jax,
                           pip=args.pip and args.pip.strip("'\""), requirements=args.requirements)
        except KeyboardInterrupt:
            raise CellInterrupted("%tpu_connect interrupted before it started anything: nothing is left running") \
                from None

    @magic_arguments()
    @argument("command", nargs=argparse.REMAINDER, help="the shell command (or the cell, with %%tpu_run)")
    @argument("--hosts", default=None, help="all (default), 0, 0,2 or 1:3")
    @argument("--timeout", type=float, default=None)
    @argument("--slice", dest="slice_name", default=None)
    @line_cell_magic
    def tpu_run(self, line: str, cell: str | None = None):
        """Run a shell command on every host; output labelled by host; fails if any host fails."""
        args = parse_line(self.tpu_run, line)
        command = cell if cell is not None else " ".join(args.command)
        if cell is not None and args.command:
            raise UsageError("with %%tpu_run the command is the cell. Usage: %%tpu_run [--hosts H] [--timeout S]")
        sl = manager.current(args.slice_name)
        with one_line_interrupt():
            result = sl.run_shell(command, hosts=args.hosts, timeout=args.timeout)
        codes = {h: r.exit_code for h, r in result.items()}
        if sl.num_hosts > 1 and any(code not in (0, None) for code in codes.values()):
            report.info("exit codes: " + ", ".join(f"[{sl.layout.name(h)}] {c}" for h, c in codes.items()))
        result.raise_for_status()

    @magic_arguments()
    @argument("local_dir", nargs="?", default=".", help="directory to copy (default: the notebook's)")
    @argument("remote_dir", nargs="?", default=None, help="where on the hosts (default: ~/<local dir name>)")
    @argument("--exclude", nargs="+", default=[], metavar="PATTERN", help="gitignore-style patterns to skip")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_sync(self, line: str):
        """Copy a working directory to every host, only what changed, honouring .gitignore."""
        from tpunb.widgets.copy_progress import byte_progress

        args = parse_line(self.tpu_sync, line)
        sl = manager.current(args.slice_name)
        patterns = tuple(p.strip("'\"") for p in args.exclude)  # IPython keeps quotes users type around globs
        with byte_progress(f"sync {args.local_dir}") as update:
            outcome = sl.sync(args.local_dir, args.remote_dir, patterns, progress=update)
        report.info(str(outcome) if outcome is not None else
                    "nothing to copy: the hosts of a local simulated slice share this machine's files")

    @magic_arguments()
    @argument("name")
    @line_magic
    def tpu_use(self, line: str):
        """Attach a slice by name (after a kernel restart, or to switch slices)."""
        args = parse_line(self.tpu_use, line)
        sl = manager.use(args.name)
        report.info(f"current slice: {sl.name} ({sl.kind}, {sl.num_hosts} host{'s' if sl.num_hosts > 1 else ''}, {sl.backend})")

    @magic_arguments()
    @argument("name", nargs="?", default=None)
    @argument("--all", action="store_true", help="every known slice")
    @line_magic
    def tpu_down(self, line: str):
        """Delete a slice (default: the current one); deleting twice is fine."""
        args = parse_line(self.tpu_down, line)
        if args.name and args.all:
            raise UsageError("give a NAME or --all, not both. usage: %tpu_down [NAME] [--all]")
        deleted = manager.down(args.name, all=args.all)
        if deleted:
            report.info(f"deleted {', '.join(deleted)}")
        else:
            report.info(f"{args.name or 'no slices'}: nothing to delete (already down)")

    @magic_arguments()
    @argument("metrics", nargs="*", help="metrics to show (default: CPU, memory, HBM, duty cycle and every "
                                         "metric cells log with tpunb.log)")
    @argument("--slice", dest="slice_name", default=None)
    @argument("--interval", type=float, default=None, help="seconds between samples on every host (0: off)")
    @line_magic
    def tpu_metrics(self, line: str):
        """Live metrics of every host, updated while cells run: %tpu_metrics [--interval S] [METRIC ...]."""
        from tpunb.widgets import in_widget_frontend
        from tpunb.widgets.live_metrics import MetricsView, render_text

        args = parse_line(self.tpu_metrics, line)
        sl = manager.current(args.slice_name)
        if args.interval is not None:
            sl.set_metrics_interval(args.interval)
        hosts = f"{sl.num_hosts} host{'s' if sl.num_hosts > 1 else ''}"
        title = f"{sl.name}, {hosts}" if sl.name == sl.kind else f"{sl.name} ({sl.kind}, {hosts})"
        if not in_widget_frontend():
            report.info(render_text(title, sl.metrics_store, sl.num_hosts, args.metrics or None,
                                    sl.metrics_interval, sl.layout.names))
            return None
        return MetricsView(title, sl.metrics_store, sl.metrics_feed, sl.num_hosts, args.metrics or None,
                           sl.metrics_interval, sl.layout.names)

    @magic_arguments()
    @argument("name", nargs="?", default=None, help="slice to check (default: the current one, if any)")
    @argument("--accelerator", default=None, help="with no slice: the type a launch would ask for, e.g. v5p-8")
    @argument("--zone", default=None, help="with no slice: the zone to check (default: the configured one)")
    @argument("--project", default=None, help="with no slice: the project to check (default: the configured one)")
    @line_magic
    def tpu_doctor(self, line: str):
        """Check credentials, project, API, quota, zone and every host's clock and disk: one row each."""
        from tpunb.magics.checkup import doctor

        args = parse_line(self.tpu_doctor, line)
        with one_line_interrupt():
            rows = doctor(args.name, accelerator=args.accelerator, zone=args.zone, project=args.project)
        report.info(str(rows))

    @magic_arguments()
    @argument("names", nargs="*", metavar="NAME", help="environment variables, e.g. HF_TOKEN")
    @line_magic
    def tpu_secret(self, line: str):
        """Secrets on every slice's hosts, masked (****) in all they send back, never stored:
        %tpu_secret NAME [NAME ...], each from this kernel's environment, Colab's secrets or a prompt."""
        args = parse_line(self.tpu_secret, line)
        with one_line_interrupt():
            names = manager.secret(*args.names)
        where = ", ".join(manager.MANAGER.attached) or "no slice yet: each one launched or used from now on"
        report.info(f"[tpunb] secret{'s' if len(names) > 1 else ''} {', '.join(names)} set on {where}; shown as ****")

    @magic_arguments()
    @argument("--versions", action="store_true", help="Python, jax, jaxlib, libtpu, flax and the environment tpunb made, of every host")
    @line_magic
    def tpu_status(self, line: str):
        """Slices and their hosts as a DataFrame (--versions: each host's package versions)."""
        args = parse_line(self.tpu_status, line)
        return manager.versions() if args.versions else manager.status()

    @magic_arguments()
    @argument("names", nargs="+", help="notebook variables to send")
    @argument("--hosts", default=None)
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_push(self, line: str):
        """Send notebook variables to the hosts under the same names."""
        args = parse_line(self.tpu_push, line)
        namespace = self.shell.user_ns
        missing = [n for n in args.names if n not in namespace]
        if missing:
            raise UsageError(f"not defined in this notebook: {', '.join(missing)}")
        manager.current(args.slice_name).push({n: namespace[n] for n in args.names}, hosts=args.hosts)

    @magic_arguments()
    @argument("name", help="variable to fetch")
    @argument("--host", default=None,
              help="only this host (3, -1, or s1/0 in a multislice): the value itself instead of {host: value}")
    @argument("--gather", action="store_true",
              help="a global jax.Array as one numpy array, each host sending only its own shards")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_pull(self, line: str):
        """Fetch a variable from the hosts into the notebook: {host: value}, or one host's value,
        or with --gather one numpy array assembled from a global jax.Array's shards."""
        args = parse_line(self.tpu_pull, line)
        sl = manager.current(args.slice_name)
        if args.gather and args.host is not None:
            raise UsageError(f"%tpu_pull {args.name} --gather assembles the array from every host: "
                             "drop --host (or pull one host's value without --gather)")
        if args.gather:
            value = sl.gather(args.name)
        elif args.host is None:
            value = sl.pull(args.name)
        else:
            chosen = sl.layout.parse(args.host)
            if len(chosen) != 1:
                raise UsageError(f"--host {args.host} picks {len(chosen)} hosts: --host takes one "
                                 f"(e.g. --host 0{' or s1/0' if sl.layout.multislice else ''}); "
                                 f"%tpu_pull {args.name} alone fetches every host's")
            value = sl.pull(args.name, hosts=chosen)[chosen[0]]
        self.shell.user_ns[args.name] = value
        return value

    @magic_arguments()
    @argument("action", nargs="?", choices=["start", "stop"], default=None,
              help="start: record on every host until stop; stop: collect and show; none: what is recorded")
    @argument("--hosts", default=None, help="all (default), 0, 0,2 or 1:3")
    @argument("--slice", dest="slice_name", default=None)
    @argument("--name", default=None, help="a name for the run (the folder xprof lists)")
    @argument("--python-tracer", action="store_true", help="also record Python function calls")
    @argument("--limit", type=float, default=600.0, help="start: a forgotten stop ends the recording after S seconds")
    @line_cell_magic
    def tpu_profile(self, line: str, cell: str | None = None):
        """Profile the cell on every host with jax.profiler (%%tpu_profile), or record between
        %tpu_profile start and %tpu_profile stop; shows a timeline per host and the top ops."""
        from IPython.display import display

        args = parse_line(self.tpu_profile, line)
        sl = manager.current(args.slice_name)
        if cell is not None:
            if args.action:
                raise UsageError("%%tpu_profile profiles the cell: use %tpu_profile start|stop on a line of its own")
            if not cell.strip():
                return
            prof = sl.profile(cell, hosts=args.hosts, name=args.name, python_tracer=args.python_tracer)
            render_values(prof.result, "grouped", sl.num_hosts, names=sl.layout.names)
            display(prof)
            prof.result.raise_for_status()
        elif args.action == "start":
            sl.profile_start(args.hosts, args.python_tracer, args.limit, args.name)
            report.info(f"[tpunb] recording on {sl.name!r}: run cells, then %tpu_profile stop "
                        f"(it ends by itself after {args.limit:g} s)")
        elif args.action == "stop":
            display(sl.profile_stop())
        else:
            report.info(sl.profiler.describe())

    # -- serving (tpunb.services) -------------------------------------------------------------------
    @magic_arguments()
    @argument("name", nargs="?", default=None, help="the service's name (letters, digits, . _ -)")
    @argument("--hosts", default=None, help="all (default), 0, 0,2 or 1:3")
    @argument("--restart", choices=["no", "on-failure"], default="no",
              help="on-failure: restart a crashed command, backing off, a bounded number of times")
    @argument("--wait-port", type=int, default=None, metavar="P", help="return once port P answers on every host")
    @argument("--wait-http", default=None, metavar="PORT/PATH", help="return once GET PATH on PORT answers on every host")
    @argument("--port", type=int, default=None, metavar="P", help="where it answers (else the wait's port): %%tpu_bench NAME reaches it")
    @argument("--timeout", type=float, default=120.0, help="seconds to wait for --wait-port/--wait-http")
    @argument("--env", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
              help="for the command only; " + policy.ENV_HELP.replace("%", "%%"))
    @argument("--secret", nargs="+", action="extend", default=[], metavar="NAME",
              help="for the command only: " + policy.SECRET_HELP.replace("%", "%%"))
    @argument("--stop", action="store_true", help="stop the service NAME on every host")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_serve(self, line: str):
        """Run a command on the hosts as a service that outlives cells and this kernel:
        %tpu_serve NAME [--hosts H] [--restart on-failure] [--wait-http PORT/PATH] -- COMMAND;
        %tpu_serve --stop NAME; %tpu_serve alone lists the services."""
        stripped = line.strip()
        if stripped == "--" or stripped.startswith("-- "):  # a command without a name before it
            head, dashes, command = "", "--", stripped[2:]
        else:
            head, dashes, command = (line + " ").partition(" -- ")
        args = parse_line(self.tpu_serve, head)
        usage = ("%tpu_serve NAME [--hosts H] [--restart on-failure] [--port P] [--wait-port P | --wait-http PORT/PATH] "
                 "-- COMMAND")
        sl = manager.current(args.slice_name)
        if args.stop:
            if not args.name or command.strip():
                raise UsageError("give the service to stop: %tpu_serve --stop NAME")
            sl.stop_service(args.name)
        elif args.name is None and not dashes:
            listed = seen.listing(manager.services(sl.name))  # the status view's rows, with their ports
            report.info(listed or f"no services on {sl.name!r}: start one with {usage}")
        elif not args.name or not command.strip():
            raise UsageError(f"give a NAME and, after --, the command. Usage: {usage}")
        else:
            with one_line_interrupt():
                sl.serve(args.name, command.strip(), hosts=args.hosts, restart=args.restart,
                         env=manager.parse_env(args.env, args.secret), wait_port=args.wait_port, wait_http=args.wait_http,
                         timeout=args.timeout, port=args.port)

    @magic_arguments()
    @argument("source", help="hf://ORG/NAME, hf://datasets/ORG/NAME, gs://BUCKET/PREFIX or https://...")
    @argument("--to", default=None, metavar="PATH",
              help="where the files go on every host (~ is each host's home), as hf download --local-dir; "
                   "default for hf://: each host's Hugging Face cache, where from_pretrained and vllm serve look")
    @argument("--include", nargs="+", action="extend", default=[], metavar="GLOB",
              help="only the files these patterns match (as huggingface_hub's allow_patterns)")
    @argument("--exclude", nargs="+", action="extend", default=[], metavar="GLOB",
              help="not the files these patterns match (as ignore_patterns), e.g. 'original/*'")
    @argument("--revision", default=None, metavar="R", help="a branch, tag or commit of an hf:// repository")
    @argument("--hosts", default=None, help="only these hosts (default: all)")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_fetch(self, line: str):
        """The same files on every host, each byte from the source once per slice:
        %tpu_fetch SOURCE [--to PATH] [--include GLOB ...] [--exclude GLOB ...] [--revision R] [--hosts H]."""
        args = parse_line(self.tpu_fetch, line)
        from tpunb.fetch.source import parse_source

        args.include, args.exclude = ([p.strip("'\"") for p in globs] for globs in (args.include, args.exclude))  # IPython
        try:  # keeps the quotes a user types around a glob
            parse_source(args.source, args.revision, args.include, args.exclude)
        except UsageError as exc:
            raise UsageError(f"{exc}. Usage: {usage_of(self.tpu_fetch)}") from None
        sl = manager.current(args.slice_name)
        with one_line_interrupt():
            done = sl.fetch(args.source, args.to, args.include, args.revision, args.hosts, args.exclude)
        report.info(f"[tpunb] fetched {done}")
        return None

    @magic_arguments()
    @argument("name", nargs="?", default=None, help="the service")
    @argument("--file", default=None, metavar="PATH", help="instead of a service: this file on every host (from the home)")
    @argument("--host", default=None, help="only this host (default: every host that runs it)")
    @argument("--tail", type=int, default=None, metavar="K", help="the last K lines")
    @argument("--follow", action="store_true", help="keep printing new lines until interrupted")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_logs(self, line: str):
        """A service's output on its hosts, or a file on every host: %tpu_logs NAME|--file PATH [--host N] [--tail K] [--follow]."""
        args = parse_line(self.tpu_logs, line)
        sl = manager.current(args.slice_name)
        if args.tail is not None and args.tail < 0:
            raise UsageError(f"--tail takes a number of lines >= 0, not {args.tail}")
        if not args.follow:
            texts = sl.logs(args.name, host=args.host, tail=args.tail, file=args.file)
            texts = {sl.layout.parse(args.host)[0]: texts} if isinstance(texts, str) else texts
            report.info(_labelled(texts, sl.layout.name, len(texts) > 1).rstrip("\n"))
            return
        lines = sl.serving.follow(args.name, args.host, 10 if args.tail is None else args.tail, file=args.file)
        try:
            with contextlib.closing(lines):  # however it ends, every host's follow ends with it
                for host, text in lines:
                    report.info(_labelled({host: text}, sl.layout.name, args.host is None and sl.num_hosts > 1).rstrip("\n"))
        except KeyboardInterrupt:
            report.info(f"[tpunb] stopped following {args.name or args.file!r}")

    @magic_arguments()
    @argument("port", type=int, help="the port on the host")
    @argument("--host", default="0", help="which host (default 0)")
    @argument("--local-port", type=int, default=None, metavar="L", help="this machine's port (default: a free one)")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_forward(self, line: str):
        """Reach PORT on a host from this machine: %tpu_forward 8000 [--host N]; returns the URL, and
        prints the link for a browser on another machine (Colab's proxy, or jupyter-server-proxy's)."""
        from tpunb.forwards.links import browser_link

        args = parse_line(self.tpu_forward, line)
        sl = manager.current(args.slice_name)
        url = sl.forward(args.port, host=args.host, local_port=args.local_port)
        link = browser_link(url)
        if link:
            report.info(f"[tpunb] port {args.port} of host {args.host}: {url} on this machine; in your browser: {link}")
        return url


def _labelled(texts: dict[int, str], name, label: bool) -> str:
    if not label:
        return "".join(texts.values())
    return "".join(f"[{name(h)}] {line}\n" for h, text in sorted(texts.items()) for line in text.splitlines())
