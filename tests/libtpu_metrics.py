"""A stand-in for libtpu's runtime metric service: a real gRPC server speaking the proto that
tpu-info ships (RuntimeMetricService.GetRuntimeMetric), so the agent's real client code runs
here as it does on a TPU VM, where libtpu serves it on localhost:8431."""
from __future__ import annotations

import re
from concurrent import futures
from pathlib import Path

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

HBM_TOTAL = 16 * 2**30


FIXTURES = Path(__file__).parent / "fixtures" / "tpu_info"


def runtime_rows(name: str) -> list[tuple[int, int, int, float]]:
    """(libtpu's chip id, HBM used, HBM total (bytes), duty cycle %) per row of the "TPU Runtime
    Utilization" table in a recorded tpu-info output."""
    text = (FIXTURES / name).read_text().split("TPU Runtime Utilization", 1)[1]
    rows = []
    for line in text.splitlines():
        found = re.match(r"\|\s*(\d+)\s*\|\s*([\d.]+) GiB / ([\d.]+) GiB\s*\|\s*([\d.]+)%", line)
        if found:
            chip, used, total, duty = found.groups()
            rows.append((int(chip), round(float(used) * 2**30), round(float(total) * 2**30), float(duty)))
    return rows


class FakeLibtpu(pb_grpc.RuntimeMetricServiceServicer):
    """Four chips; chip i uses (i + 1) GiB of HBM and is busy 10 * (i + 1) percent of the time.
    ``rows``: serve what a recorded tpu-info output shows instead (``runtime_rows``)."""

    def __init__(self, chips: int = 4, rows: list | None = None) -> None:
        self.chips = chips
        self.rows = rows
        self.requests: list[str] = []

    def GetRuntimeMetric(self, request, context):
        self.requests.append(request.metric_name)
        values = {
            "tpu.runtime.hbm.memory.usage.bytes": lambda i: pb.Gauge(as_int=(i + 1) * 2**30),
            "tpu.runtime.hbm.memory.total.bytes": lambda i: pb.Gauge(as_int=HBM_TOTAL),
            "tpu.runtime.tensorcore.dutycycle.percent": lambda i: pb.Gauge(as_double=10.0 * (i + 1)),
        }
        if self.rows is not None:
            column = {"tpu.runtime.hbm.memory.usage.bytes": lambda r: pb.Gauge(as_int=r[1]),
                      "tpu.runtime.hbm.memory.total.bytes": lambda r: pb.Gauge(as_int=r[2]),
                      "tpu.runtime.tensorcore.dutycycle.percent": lambda r: pb.Gauge(as_double=r[3])}
            values = {name: (lambda i, get=get: get(self.rows[i])) for name, get in column.items()}
        if request.metric_name not in values:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no metric {request.metric_name}")
        ids = [row[0] for row in self.rows] if self.rows is not None else list(range(self.chips))
        metrics = [pb.Metric(attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=ids[i])),
                             gauge=values[request.metric_name](i)) for i in range(len(ids))]
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=metrics))


def serve(rows: list | None = None) -> tuple[grpc.Server, FakeLibtpu, str]:
    """Start it on a free loopback port with local credentials, as libtpu's server accepts."""
    servicer = FakeLibtpu(rows=rows)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_RuntimeMetricServiceServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.local_server_credentials())
    server.start()
    return server, servicer, f"127.0.0.1:{port}"
