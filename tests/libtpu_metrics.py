"""A stand-in for libtpu's runtime metric service: a real gRPC server speaking the proto that
tpu-info ships (RuntimeMetricService.GetRuntimeMetric), so the agent's real client code runs
here as it does on a TPU VM, where libtpu serves it on localhost:8431."""
from __future__ import annotations

from concurrent import futures

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

HBM_TOTAL = 16 * 2**30


class FakeLibtpu(pb_grpc.RuntimeMetricServiceServicer):
    """Four chips; chip i uses (i + 1) GiB of HBM and is busy 10 * (i + 1) percent of the time."""

    def __init__(self, chips: int = 4) -> None:
        self.chips = chips
        self.requests: list[str] = []

    def GetRuntimeMetric(self, request, context):
        self.requests.append(request.metric_name)
        values = {
            "tpu.runtime.hbm.memory.usage.bytes": lambda i: pb.Gauge(as_int=(i + 1) * 2**30),
            "tpu.runtime.hbm.memory.total.bytes": lambda i: pb.Gauge(as_int=HBM_TOTAL),
            "tpu.runtime.tensorcore.dutycycle.percent": lambda i: pb.Gauge(as_double=10.0 * (i + 1)),
        }
        if request.metric_name not in values:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no metric {request.metric_name}")
        metrics = [pb.Metric(attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=i)),
                             gauge=values[request.metric_name](i)) for i in range(self.chips)]
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=metrics))


def serve() -> tuple[grpc.Server, FakeLibtpu, str]:
    """Start it on a free loopback port with local credentials, as libtpu's server accepts."""
    servicer = FakeLibtpu()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_RuntimeMetricServiceServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.local_server_credentials())
    server.start()
    return server, servicer, f"127.0.0.1:{port}"
