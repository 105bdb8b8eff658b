"""OpenTelemetry traces into a real OTLP receiver, from the poolserve binary it starts.

The receiver is a gRPC server of opentelemetry-proto's TraceService (the collector's OTLP/gRPC
API, as an OpenTelemetry Collector serves it on 4317), started here. Checked: the span of each
request (name, kind, status code, model, service.name), its phases as children (tokenize,
queue, inference, postprocess) inside its time, a W3C `traceparent` on the request making it a
child of the caller's span, a refused request's span without inference, gRPC calls traced by
their method, and the spans still queued sent when the server stops. Then the same server with
no collector behind its endpoint: requests are answered and the server still stops promptly.

    python tests/protocols/otlp_check.py POOLSERVE_BINARY MODEL_DIR
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grpc_check import pb, rpc  # noqa: E402  (stubs compiled from proto/tei.proto)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, with its resource's attributes."""

    def __init__(self):
        self.spans = []
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append((resource, span))
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, predicate, what, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            with self.lock:
                found = [s for r, s in self.spans if predicate(s)]
            if found:
                return found
            time.sleep(0.1)
        with self.lock:
            names = [s.name for _, s in self.spans]
        raise SystemExit(f"no span {what} reached the receiver (it has: {names})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary, model, flags, log_name):
    port = free_port()
    log = open(f"target/{log_name}-{port}.log", "w")
    # The SDK's batch exporter sends every 100 ms here (5 s by default) so the check is quick.
    env = dict(os.environ, OTEL_BSP_SCHEDULE_DELAY="100")
    command = [binary, "serve", model, "--host", "127.0.0.1", "--port", str(port), *flags]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    with httpx.Client(timeout=5) as client:
        for _ in range(600):
            if process.poll() is not None:
                raise SystemExit(f"the server stopped: see target/{log_name}-{port}.log")
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return process, port
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def attributes(span):
    out = {}
    for a in span.attributes:
        value = a.value
        out[a.key] = value.string_value if value.HasField("string_value") else value.int_value
    return out


def children_of(receiver, root):
    return receiver.wait_for(lambda s: s.parent_span_id == root.span_id and s.name == "postprocess", "postprocess") and [
        s for _, s in receiver.spans if s.parent_span_id == root.span_id
    ]


def stop(process, what):
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise SystemExit(f"{what}: the server did not stop within 20 s of SIGTERM")


def main(binary, model):
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    collector_port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    process, port = serve(
        binary, model, ["--otlp-endpoint", f"http://127.0.0.1:{collector_port}", "--otlp-service-name", "otlp-check"], "otlp-check"
    )
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=30) as client:
        traceparent = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
        reply = client.post(f"{base}/v1/embeddings", json={"input": ["a traced request", "and its second text"]}, headers={"traceparent": traceparent})
        assert reply.status_code == 200, reply.text
        reply = client.post(f"{base}/embed", json={"inputs": "no caller trace"})
        assert reply.status_code == 200, reply.text
        reply = client.post(f"{base}/v1/embeddings", json={"input": []})
        assert reply.status_code == 400, reply.text
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        rpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="over gRPC"))

    # The caller's trace: our span is its child, a server span with the request's facts.
    root = receiver.wait_for(lambda s: s.parent_span_id.hex() == PARENT_SPAN, "with the caller's span as parent")[0]
    assert root.trace_id.hex() == TRACE_ID, root.trace_id.hex()
    assert root.name == "POST /v1/embeddings", root.name
    assert root.parent_span_id.hex() == PARENT_SPAN, root.parent_span_id.hex()
    assert root.kind == root.SPAN_KIND_SERVER, root.kind
    facts = attributes(root)
    assert facts["http.response.status_code"] == 200 and facts["http.request.method"] == "POST", facts
    assert facts["gen_ai.request.model"] and facts["gen_ai.usage.input_tokens"] > 0, facts
    resource = next(r for r, s in receiver.spans if s.span_id == root.span_id)
    assert resource.get("service.name") == "otlp-check", resource

    # Its phases, in order and inside it.
    children = children_of(receiver, root)
    names = sorted(s.name for s in children)
    assert names == ["inference", "postprocess", "queue", "tokenize"], names
    by_name = {s.name: s for s in children}
    for child in children:
        assert child.trace_id == root.trace_id
        assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano <= root.end_time_unix_nano, child.name
    assert by_name["tokenize"].end_time_unix_nano <= by_name["queue"].start_time_unix_nano + 1_000_000, "tokenize before queue"
    assert by_name["queue"].end_time_unix_nano <= by_name["postprocess"].start_time_unix_nano
    assert by_name["inference"].end_time_unix_nano <= by_name["postprocess"].start_time_unix_nano

    # A request without a caller's trace starts one of its own.
    other = receiver.wait_for(lambda s: s.name == "POST /embed", "for /embed")[0]
    assert other.trace_id.hex() != TRACE_ID and not other.parent_span_id, other
    # A refused request: its span says 400, and no model work ran.
    refused = receiver.wait_for(lambda s: s.name == "POST /v1/embeddings" and attributes(s)["http.response.status_code"] == 400, "for the 400")[0]
    assert not [s for _, s in receiver.spans if s.parent_span_id == refused.span_id and s.name == "inference"]
    # gRPC: named by its method.
    receiver.wait_for(lambda s: s.name == "POST /tei.v1.Embed/Embed", "for the gRPC call")

    # The spans still queued at SIGTERM are sent before the server exits.
    with httpx.Client(timeout=30) as client:
        assert client.post(f"{base}/embed", json={"inputs": "the last request"}).status_code == 200
    stop(process, "with a collector")
    with receiver.lock:
        last = [s for _, s in receiver.spans if s.name == "POST /embed"]
    assert len(last) == 2, f"the last request's span was not flushed at exit ({len(last)} /embed spans)"
    print(f"otlp: {len(receiver.spans)} spans received; parent, phases, refusals, gRPC and the flush at exit: ok")

    # No collector behind the endpoint: requests are answered, and the server stops promptly.
    server.stop(0)
    process, port = serve(binary, model, ["--otlp-endpoint", f"http://127.0.0.1:{free_port()}"], "otlp-check-absent")
    with httpx.Client(timeout=30) as client:
        for i in range(20):
            assert client.post(f"http://127.0.0.1:{port}/embed", json={"inputs": f"text {i}"}).status_code == 200
    started = time.time()
    stop(process, "without a collector")
    print(f"otlp: no collector: 20 requests answered; stopped {time.time() - started:.1f} s after SIGTERM: ok")


if __name__ == "__main__":
    main(*sys.argv[1:3])
