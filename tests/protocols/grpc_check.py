"""TEI's gRPC API through a real gRPC client (grpcio), against a running poolserve.

The stubs are generated here from proto/tei.proto, TEI's proto unchanged, so a TEI client's
own stubs are what is tested. Answers are checked against the fixtures' transformers
references (tests/fixtures/expected/*.json) and against the same request over HTTP; errors
against TEI's gRPC codes and messages (router/src/grpc/server.rs).

    python tests/protocols/grpc_check.py embed HOST:PORT      # bert-embed-mean served
    python tests/protocols/grpc_check.py rerank HOST:PORT     # bert-reranker served
    python tests/protocols/grpc_check.py auth HOST:PORT KEY   # any model, --api-key KEY
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stubs():
    """tei_pb2 and tei_pb2_grpc, compiled from proto/tei.proto by grpcio-tools."""
    out = tempfile.mkdtemp(prefix="tei-stubs-")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}/proto", f"--python_out={out}", f"--grpc_python_out={out}", "tei.proto"],
        check=True,
    )
    sys.path.insert(0, out)
    import tei_pb2
    import tei_pb2_grpc

    return tei_pb2, tei_pb2_grpc


pb, rpc = stubs()


def expected(name):
    with open(f"{ROOT}/tests/fixtures/expected/{name}.json") as f:
        return json.load(f)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def http(address, path, body):
    request = urllib.request.Request(f"http://{address}{path}", json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def fails(call, code, message=None):
    """`call` fails with `code` (and `message`, when given, exactly)."""
    try:
        call()
    except grpc.RpcError as e:
        assert e.code() == code, f"{e.code()} ({e.details()}), expected {code}"
        if message is not None:
            assert e.details() == message, f"{e.details()!r}, expected {message!r}"
        return e
    raise AssertionError(f"expected {code}, the call succeeded")


def health(channel, service):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service)).status


def reflected_services(channel):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    return {s.name for answer in answers for s in answer.list_services_response.service}


def check_embed(address):
    from grpc_health.v1 import health_pb2

    reference = expected("bert-embed-mean")
    texts = [t for t in reference["texts"] if t["text"]]
    channel = grpc.insecure_channel(address)
    embed = rpc.EmbedStub(channel)

    info = rpc.InfoStub(channel).Info(pb.InfoRequest())
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING and info.max_input_length == 128, info

    # Embed: the reference's vectors; the same numbers as HTTP /embed; TEI's metadata.
    for t in texts:
        answer, call = embed.Embed.with_call(pb.EmbedRequest(inputs=t["text"], truncate=True))
        assert cosine(answer.embeddings, t["embedding"]) >= 0.9999, t["text"]
        assert list(answer.embeddings) == [float(x) for x in _f32(http(address, "/embed", {"inputs": t["text"]})[0])], "gRPC and HTTP differ"
        assert answer.metadata.compute_tokens == len(t["input_ids"]), (answer.metadata, t["input_ids"])
        assert answer.metadata.compute_chars == len(t["text"])
        assert answer.metadata.total_time_ns >= answer.metadata.inference_time_ns > 0
        headers = dict(call.initial_metadata())
        assert headers["x-compute-tokens"] == str(len(t["input_ids"])) and headers["x-compute-type"] == "cpu", headers
    # normalize=false gives the unnormalized vector; dimensions cuts and normalizes.
    raw = embed.Embed(pb.EmbedRequest(inputs=texts[0]["text"], normalize=False)).embeddings
    assert cosine(raw, texts[0]["embedding_unnormalized"]) >= 0.9999
    assert abs(math.sqrt(sum(x * x for x in raw)) - math.sqrt(sum(x * x for x in texts[0]["embedding_unnormalized"]))) < 1e-3
    cut = embed.Embed(pb.EmbedRequest(inputs=reference["inputs"]["texts"][0], dimensions=16)).embeddings
    assert len(cut) == 16 and cosine(cut, reference["matryoshka"]["embeddings"][0]) >= 0.9999

    # EmbedStream: answers in request order, each the unary answer.
    many = [t["text"] for t in texts] * 10
    streamed = list(embed.EmbedStream(iter(pb.EmbedRequest(inputs=x) for x in many)))
    assert len(streamed) == len(many)
    for text, answer in zip(many, streamed):
        want = next(t for t in texts if t["text"] == text)["embedding"]
        assert cosine(answer.embeddings, want) >= 0.9999
    # A long stream of the shortest texts, sent as fast as the client can (each its own 8-byte
    # HTTP/2 frame) while the client reads no answer for a while: the server reads a window of
    # them, flow control holds the client back, and the connection must not be closed as a
    # flood of small frames (h2's guard; with hyper's default windows it was, after ~35 answers).
    flood = embed.EmbedStream(iter(pb.EmbedRequest(inputs="t") for _ in range(60000)))
    time.sleep(3)
    assert sum(1 for a in flood if len(a.embeddings) == 32) == 60000
    # EmbedAll: each token's vector (no Dense layers here: the last hidden state).
    every = embed.EmbedAll(pb.EmbedAllRequest(inputs=texts[0]["text"]))
    assert len(every.token_embeddings) == len(texts[0]["input_ids"])
    for got, want in zip(every.token_embeddings, texts[0]["last_hidden_state"]):
        assert cosine(got.embeddings, want) >= 0.9999
    assert len(list(embed.EmbedAllStream(iter([pb.EmbedAllRequest(inputs="a"), pb.EmbedAllRequest(inputs="b")])))) == 2

    # Tokenize and Decode, with proto3's defaults (special tokens off unless asked for).
    tokenize = rpc.TokenizeStub(channel)
    ids = [t.id for t in tokenize.Tokenize(pb.EncodeRequest(inputs=texts[0]["text"], add_special_tokens=True)).tokens]
    assert ids == texts[0]["input_ids"], ids
    plain = tokenize.Tokenize(pb.EncodeRequest(inputs=texts[0]["text"])).tokens
    assert [t.id for t in plain] == texts[0]["input_ids"][1:-1]
    assert plain[0].start == 0 and plain[0].text == texts[0]["text"][plain[0].start : plain[0].stop] == "A"
    assert tokenize.Decode(pb.DecodeRequest(ids=texts[0]["input_ids"], skip_special_tokens=True)).text == http(
        address, "/decode", {"ids": texts[0]["input_ids"]}
    )[0]
    assert "[CLS]" in tokenize.Decode(pb.DecodeRequest(ids=texts[0]["input_ids"])).text
    assert len(list(tokenize.TokenizeStream(iter([pb.EncodeRequest(inputs="a b"), pb.EncodeRequest(inputs="c")])))) == 2
    assert [d.text for d in tokenize.DecodeStream(iter([pb.DecodeRequest(ids=[43]), pb.DecodeRequest(ids=[255])]))] == ["a", "man"]

    # Errors: TEI's codes and words.
    I, F = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    fails(lambda: embed.Embed(pb.EmbedRequest(inputs="")), I, "Input validation error: `inputs` cannot be empty")
    fails(lambda: embed.Embed(pb.EmbedRequest(inputs="word " * 200)), I, "Input validation error: `inputs` must have less than 128 tokens. Given: 202")
    assert len(embed.Embed(pb.EmbedRequest(inputs="word " * 200, truncate=True)).embeddings) == 32
    fails(lambda: embed.Embed(pb.EmbedRequest(inputs="a", truncation_direction=7)), I)
    fails(lambda: embed.Embed(pb.EmbedRequest(inputs="a", dimensions=0)), I, "Input validation error: `dimensions` should be positive")
    fails(lambda: embed.EmbedSparse(pb.EmbedSparseRequest(inputs="a")), F, "Backend error: Model is not an embedding model with SPLADE pooling")
    fails(lambda: rpc.RerankStub(channel).Rerank(pb.RerankRequest(query="q", texts=["a"])), F, "model is not a classifier model")
    fails(lambda: rpc.RerankStub(channel).Rerank(pb.RerankRequest(query="q")), I, "`texts` cannot be empty")
    fails(lambda: rpc.PredictStub(channel).Predict(pb.PredictRequest(inputs="a")), F)
    fails(lambda: rpc.PredictStub(channel).PredictPair(pb.PredictPairRequest(inputs=["a", "b", "c"])), I, "`inputs` must have a single or two elements. Given: 3")
    fails(lambda: embed.Embed(pb.EmbedRequest(inputs="a"), metadata=[("model", "nope")]), grpc.StatusCode.NOT_FOUND)
    # A stream ends at its first failing message, after the answers before it.
    answers = embed.EmbedStream(iter([pb.EmbedRequest(inputs="a"), pb.EmbedRequest(inputs=""), pb.EmbedRequest(inputs="b")]))
    assert len(next(answers).embeddings) == 32
    fails(lambda: next(answers), I, "Input validation error: `inputs` cannot be empty")
    # The model's name in metadata, as `model` in an HTTP body.
    with urllib.request.urlopen(f"http://{address}/v1/models") as response:
        name = json.load(response)["data"][0]["id"]
    assert len(embed.Embed(pb.EmbedRequest(inputs="a"), metadata=[("model", name)]).embeddings) == 32

    # Health (TEI: the services the model kind cannot answer are NOT_SERVING) and reflection.
    assert health(channel, "") == health_pb2.HealthCheckResponse.SERVING
    assert health(channel, "tei.v1.Embed") == health_pb2.HealthCheckResponse.SERVING
    assert health(channel, "tei.v1.Rerank") == health_pb2.HealthCheckResponse.NOT_SERVING
    fails(lambda: health(channel, "no.such.Service"), grpc.StatusCode.NOT_FOUND)
    services = reflected_services(channel)
    assert {"tei.v1.Embed", "tei.v1.Rerank", "tei.v1.Info", "grpc.health.v1.Health"} <= services, services
    print("grpc embed: ok")


def _f32(values):
    """HTTP's JSON numbers as the f32 they were (gRPC sends f32)."""
    import struct

    return [struct.unpack("f", struct.pack("f", v))[0] for v in values]


def check_rerank(address):
    reference = expected("bert-reranker")
    pairs = reference["pairs"]
    channel = grpc.insecure_channel(address)
    assert rpc.InfoStub(channel).Info(pb.InfoRequest()).model_type == pb.MODEL_TYPE_RERANKER
    rerank = rpc.RerankStub(channel)

    query = pairs[0]["query"]
    same_query = [p for p in pairs if p["query"] == query]
    answer = rerank.Rerank(pb.RerankRequest(query=query, texts=[p["document"] for p in same_query], return_text=True))
    assert [r.index for r in answer.ranks] == sorted(range(len(same_query)), key=lambda i: -same_query[i]["score"])
    for r in answer.ranks:
        assert abs(r.score - same_query[r.index]["score"]) <= 1e-4 and r.text == same_query[r.index]["document"]
    over_http = http(address, "/rerank", {"query": query, "texts": [p["document"] for p in same_query]})
    assert [(r["index"], _f32([r["score"]])[0]) for r in over_http] == [(r.index, r.score) for r in answer.ranks]
    raw = rerank.Rerank(pb.RerankRequest(query=query, texts=[same_query[0]["document"]], raw_scores=True))
    assert abs(raw.ranks[0].score - same_query[0]["logit"]) <= 1e-4

    # RerankStream: every pair its own query; raw_scores and return_text from the first message.
    streamed = rerank.RerankStream(iter(pb.RerankStreamRequest(query=p["query"], text=p["document"], return_text=(i == 0)) for i, p in enumerate(pairs * 4)))
    assert len(streamed.ranks) == len(pairs) * 4
    for r in streamed.ranks:
        assert abs(r.score - pairs[r.index % len(pairs)]["score"]) <= 1e-4 and r.text == pairs[r.index % len(pairs)]["document"]
    assert [r.score for r in streamed.ranks] == sorted((r.score for r in streamed.ranks), reverse=True)
    assert streamed.metadata.compute_chars == 4 * sum(len(p["query"]) + len(p["document"]) for p in pairs)
    assert streamed.metadata.compute_tokens == 4 * sum(len(p["input_ids"]) for p in pairs)
    fails(lambda: rerank.RerankStream(iter([])), grpc.StatusCode.INVALID_ARGUMENT, "`texts` cannot be empty")

    # Predict and PredictPair: sigmoid of the one logit, TEI's label.
    predict = rpc.PredictStub(channel)
    pair = predict.PredictPair(pb.PredictPairRequest(inputs=[pairs[1]["query"], pairs[1]["document"]]))
    assert abs(pair.predictions[0].score - pairs[1]["score"]) <= 1e-4 and pair.predictions[0].label == "LABEL_0"
    assert pair.metadata.compute_tokens == len(pairs[1]["input_ids"])
    over_http = http(address, "/predict", {"inputs": [pairs[1]["query"], pairs[1]["document"]]})
    assert _f32([over_http[0]["score"]])[0] == pair.predictions[0].score
    one = predict.Predict(pb.PredictRequest(inputs=reference["inputs"]["texts"][0]))
    assert abs(one.predictions[0].score - reference["texts"][0]["sigmoid"][0]) <= 1e-4
    streamed = list(predict.PredictPairStream(iter(pb.PredictPairRequest(inputs=[p["query"], p["document"]]) for p in pairs)))
    assert [round(s.predictions[0].score, 4) for s in streamed] == [round(p["score"], 4) for p in pairs]
    assert len(list(predict.PredictStream(iter([pb.PredictRequest(inputs="a"), pb.PredictRequest(inputs="b")])))) == 2
    fails(lambda: rpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="a")), grpc.StatusCode.FAILED_PRECONDITION)
    print("grpc rerank: ok")


def check_auth(address, key):
    from grpc_health.v1 import health_pb2

    channel = grpc.insecure_channel(address)
    tokenize = rpc.TokenizeStub(channel)
    fails(lambda: tokenize.Tokenize(pb.EncodeRequest(inputs="a")), grpc.StatusCode.UNAUTHENTICATED, "No valid auth token")
    fails(lambda: tokenize.Tokenize(pb.EncodeRequest(inputs="a"), metadata=[("authorization", "Bearer wrong")]), grpc.StatusCode.UNAUTHENTICATED)
    assert tokenize.Tokenize(pb.EncodeRequest(inputs="a"), metadata=[("authorization", f"Bearer {key}")]).tokens
    assert health(channel, "") == health_pb2.HealthCheckResponse.SERVING  # probes need no key
    print("grpc auth: ok")


if __name__ == "__main__":
    what, address = sys.argv[1], sys.argv[2]
    {"embed": lambda: check_embed(address), "rerank": lambda: check_rerank(address), "auth": lambda: check_auth(address, sys.argv[3])}[what]()
