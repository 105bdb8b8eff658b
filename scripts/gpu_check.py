#!/usr/bin/env python3
"""The Python half of scripts/gpu-check.sh (standard library only, plus torch and
sentence-transformers for `st`).

    gpu_check.py parity BIN DEVICE DTYPE      # every fixture model through the real server
    gpu_check.py st CORPUS MODEL DEVICE DTYPE # sentence-transformers encode on the same corpus
    gpu_check.py memory BIN MODEL DEVICE DTYPE MAX_BATCH_TOKENS
                                              # peak device memory under full batches, and
                                              # oversized requests answered, not crashed on
    gpu_check.py table OUT DTYPE CONCURRENCY SIZES  # the summary table of scripts/gpu-check.sh
    gpu_check.py real BIN MODEL DEVICE        # a base-sized random folder vs transformers: parity
                                              # (long inputs too) and bfloat16 speed
    gpu_check.py torch-half DEVICE            # transformers' own half-precision distance on the
                                              # reward fixtures (the fair bar for ours)

`parity` starts `BIN serve` once per folder of tests/fixtures/models with `--device DEVICE
--dtype DTYPE`, sends the fixture's inputs over HTTP and compares the replies with the committed
reference outputs in tests/fixtures/expected: embeddings by cosine, probabilities and scores by
absolute difference. Limits: float32 cosine >= 0.9999 and differences <= 1e-4; half
precision cosine >= 0.999 and differences <= 1e-2. Every folder must have a check here: a new
fixture without one fails the run instead of being skipped. Prints one line per check and
exits 1 if any fails.
"""
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

FIXTURES = "tests/fixtures"


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else (1.0 if na == nb else 0.0)


def max_abs_diff(a, b):
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


class Server:
    """`BIN serve MODEL` on a free port, until the `with` block ends."""

    def __init__(self, binary, model, device, dtype, flags):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(f"target/gpu-check/{os.path.basename(model)}-{dtype}.log", "w")
        args = [binary, "serve", model, "--host", "127.0.0.1", "--port", str(self.port), "--device", device, "--dtype", dtype, *flags]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after 120 s; see {self.log.name}")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()

    def post(self, path, body):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{path}: HTTP {e.code}: {e.read().decode()[:300]}") from None

    def kernels_fell_back(self):
        """Whether the CUDA kernels' self-check failed at load (the server then runs candle's
        composite ops: correct but slow, so the run must say so)."""
        self.log.flush()
        with open(self.log.name) as f:
            return "self-check failed" in f.read()


def texts_of(cases):
    return [c["text"] for c in cases]


def check_embeddings(server, expected, cases=None):
    cases = cases or expected["texts"]
    reply = server.post("/v1/embeddings", {"input": texts_of(cases)})
    return [("cosine", cosine(d["embedding"], c["embedding"])) for d, c in zip(reply["data"], cases)]


def check_dense_dims(server, expected):
    """stella's layout: the Dense folder modules.json lists (2_Dense_24) by default."""
    return check_embeddings(server, expected, expected["dense"]["2_Dense_24"])


def check_tasks(server, expected):
    """jina-embeddings-v3: every task adapter (Jina's `task` field) and the base weights."""
    results = []
    for task, rows in expected["tasks"].items():
        body = {"input": expected["texts"]} | ({} if task == "none" else {"task": task})
        reply = server.post("/v1/embeddings", body)
        results += [("cosine", cosine(d["embedding"], row)) for d, row in zip(reply["data"], rows)]
    return results


def check_lora(server, expected, base):
    """The LoRA adapters of `base` the server was started with (LORA flags): each against
    PEFT's merged model (tests/fixtures/expected/lora.json)."""
    lora = json.load(open(f"{FIXTURES}/expected/lora.json"))
    results = []
    for entry in (e for e in lora["adapters"] if e["base"] == base and e["adapter"] == LORA_CHECKED[base]):
        reply = server.post("/v1/embeddings", {"model": entry["adapter"], "input": lora["texts"]})
        results += [("cosine", cosine(d["embedding"], row)) for d, row in zip(reply["data"], entry["embeddings"])]
    return results


def check_classify(server, expected, activation):
    cases = expected["texts"]
    reply = server.post("/classify", {"input": texts_of(cases)})
    return [("diff", max_abs_diff(d["probs"], c[activation] if isinstance(c[activation], list) else [c[activation]])) for d, c in zip(reply["data"], cases)]


def check_pairs(server, expected):
    results = []
    for pair in expected["pairs"]:
        reply = server.post("/score", {"text_1": pair["query"], "text_2": pair["document"]})
        results.append(("diff", abs(reply["data"][0]["score"] - pair["score"])))
    return results


def check_generative(server, expected, name):
    """vLLM's /generative_scoring (`--runner generate`): every case of the model in
    tests/fixtures/expected/generative-scoring.json, each item's probability."""
    results = []
    for case in expected["models"][name]["cases"]:
        reply = server.post("/generative_scoring", case["request"])
        results += [("diff", abs(d["score"] - want)) for d, want in zip(reply["data"], case["scores"])]
    return results


def check_token_classify(server, expected):
    results = []
    for case in expected["texts"]:
        reply = server.post("/pooling", {"input": case["text"], "task": "token_classify"})
        rows = reply["data"][0]["data"]
        results.append(("diff", max(max_abs_diff(r, w) for r, w in zip(rows, case["softmax"])) if len(rows) == len(case["softmax"]) else float("inf")))
    return results


def check_sparse(server, expected):
    vocab = expected["sparse"]["vocab_size"]
    reply = server.post("/pooling", {"input": texts_of(expected["texts"]), "task": "embed_sparse"})
    results = []
    for item, case in zip(reply["data"], expected["texts"]):
        ours, want = [0.0] * vocab, [0.0] * vocab
        for p in item["data"]:
            ours[p["index"]] = p["value"]
        for i, v in zip(case["sparse"]["indices"], case["sparse"]["values"]):
            want[i] = v
        results.append(("cosine", cosine(ours, want)))
    return results


def check_multi_vector(server, expected):
    results = []
    for case in expected["texts"]:
        rows = server.post("/pooling", {"input": case["text"], "task": "token_embed"})["data"][0]["data"]
        if len(rows) != len(case["token_vectors"]):
            results.append(("cosine", 0.0))
            continue
        results.append(("cosine", min(cosine(r, w) for r, w in zip(rows, case["token_vectors"]))))
    for pair in expected["pairs"]:
        score = server.post("/score", {"text_1": pair["query"], "text_2": pair["document"]})["data"][0]["score"]
        # MaxSim sums one cosine-like term per query token: compare per token.
        results.append(("diff", abs(score - pair["maxsim"]) / len(pair["query_input_ids"])))
    return results


def check_page_retriever(server, expected):
    """ColPali / ColQwen2 / ColQwen3 / ColModernVBert: each query's and each PNG page's vectors (every row against
    transformers'), and a query's MaxSim scores against the PNG pages (per query token). The
    JPEG page is left out: its decoder differs from libjpeg-turbo's (docs/models.md, Visual document
    retrieval)."""
    results = []
    for case in expected["queries"]:
        rows = server.post("/pooling", {"input": case["text"], "task": "token_embed"})["data"][0]["data"]
        want = [case["vectors"][i:i + len(rows[0])] for i in range(0, len(case["vectors"]), len(rows[0]))]
        results.append(("cosine", min(cosine(r, w) for r, w in zip(rows, want)) if len(rows) == len(want) else 0.0))
    pages = [(j, i) for j, i in enumerate(expected["images"]) if i["file"].endswith(".png")]
    for _, image in pages:
        message = {"role": "user", "content": [image_part(image["file"])]}
        rows = server.post("/pooling", {"messages": [message], "task": "token_embed"})["data"][0]["data"]
        want = [image["vectors"][i:i + len(rows[0])] for i in range(0, len(image["vectors"]), len(rows[0]))]
        results.append(("cosine", min(cosine(r, w) for r, w in zip(rows, want)) if len(rows) == len(want) else 0.0))
    query = expected["queries"][0]
    # vLLM 0.33's documents: each {"content": [...]} one page.
    reply = server.post("/score", {"data_1": query["text"], "data_2": [{"content": [image_part(i["file"])]} for _, i in pages]})
    for item, (j, _) in zip(reply["data"], pages):
        results.append(("diff", abs(item["score"] - expected["scores"][0][j]) / len(query["input_ids"])))
    return results


def check_chat_framed_images(server, expected):
    """Qwen3-VL-Embedding: each input (texts, the PNG images, an image with text) alone as a
    chat-style message, then all of them in one request. The JPEG is left out (its decoder)."""
    cases = [c for c in expected["inputs"] if not c.get("image", "").endswith(".jpg")]

    def content(case):
        image = [image_part(case["image"])] if "image" in case else []
        text = [{"type": "text", "text": case["text"]}] if "text" in case else []
        return text + image if case.get("text_first") else image + text
    results = []
    for case in cases:
        embedding = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": content(case)}]})["data"][0]["embedding"]
        results.append(("cosine", cosine(embedding, case["vector"])))
    reply = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": content(c)} for c in cases]})
    results += [("cosine", cosine(d["embedding"], c["batched"])) for d, c in zip(reply["data"], cases)]
    return results


def check_image_pairs(server, expected):
    """Qwen3-VL-Reranker: each (query, document) pair, a text or a PNG image on either side, on
    /score (vLLM's `{"content": [...]}` sides)."""
    def side(s):
        return {"content": [image_part(s["image"])]} if "image" in s else s["text"]
    results = []
    for pair in expected["pairs"]:
        score = server.post("/score", {"data_1": side(pair["query"]), "data_2": side(pair["document"])})["data"][0]["score"]
        results.append(("diff", abs(score - pair["score"])))
    return results


def check_image_text(server, expected):
    """CLIP / SigLIP: texts through `input`, images as data-URL messages (image embeddings get
    the image-embedding cosine floor, 0.999, via the text floor's check)."""
    import base64
    reply = server.post("/v1/embeddings", {"input": texts_of(expected["texts"])})
    results = [("cosine", cosine(d["embedding"], c["text_embeds_normalized"])) for d, c in zip(reply["data"], expected["texts"])]
    for image in expected["images"]:
        kind = {"jpg": "jpeg"}.get(image["file"].rsplit(".", 1)[-1], image["file"].rsplit(".", 1)[-1])
        data = base64.b64encode(open(f"{FIXTURES}/images/{image['file']}", "rb").read()).decode()
        message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{data}"}}]}
        embedding = server.post("/v1/embeddings", {"messages": [message]})["data"][0]["embedding"]
        # Image cosines are held to 0.999: report the distance from it on the text scale.
        results.append(("cosine", 1 - (1 - cosine(embedding, image["image_embeds_normalized"])) / 10))
    return results


def image_part(file):
    """An OpenAI `image_url` content part carrying a fixture image as a data URL (`pages/…` from
    the fixtures folder, a bare name from its images/)."""
    import base64
    kind = {"jpg": "jpeg"}.get(file.rsplit(".", 1)[-1], file.rsplit(".", 1)[-1])
    path = f"{FIXTURES}/{file}" if "/" in file else f"{FIXTURES}/images/{file}"
    data = base64.b64encode(open(path, "rb").read()).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{data}"}}


def check_soft_token_images(server, expected):
    """EmbeddingGemma 2: texts, then each image alone and all of them in one request (the soft
    tokens of Gemma 4's vision tower in the text encoder), then text and images in one input,
    then audio alone, batched, and with text (its audio tower), then the videos that fit the
    fixture's 256 positions, all in one request, and with text and an image (their sampled
    frames through the vision tower)."""
    results = check_embeddings(server, expected)
    messages = [[{"role": "user", "content": [image_part(i["file"])]}] for i in expected["images"]]
    for message, image in zip(messages, expected["images"]):
        embedding = server.post("/v1/embeddings", {"messages": message})["data"][0]["embedding"]
        results.append(("cosine", cosine(embedding, image["embedding"])))
    # Cohere v2 takes several image inputs in one request: the batched path.
    reply = server.post("/v2/embed", {"input_type": "image", "embedding_types": ["float"],
                                      "images": [image_part(i["file"])["image_url"]["url"] for i in expected["images"]]})
    results += [("cosine", cosine(e, i["embedding"])) for e, i in zip(reply["embeddings"]["float"], expected["images"])]
    for case in expected["interleaved"]:
        content = [{"type": "text", "text": p["text"]} if "text" in p else image_part(p["image"]) for p in case["parts"]]
        embedding = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": content}]})["data"][0]["embedding"]
        results.append(("cosine", cosine(embedding, case["embedding"])))
    # Audio (Gemma 4's audio tower): the files transformers decodes as we do (PCM and FLAC at
    # 16 kHz; the others differ in the decoder's and resampler's last bits), all in one request,
    # then text with audio.
    exact = [a for a in expected.get("audio", []) if "16k" in a["file"] and a["file"].endswith((".wav", ".flac"))]
    if exact:
        reply = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": [audio_part(a["file"])]} for a in exact]})
        results += [("cosine", cosine(d["embedding"], a["embedding"])) for d, a in zip(reply["data"], exact)]
    for case in expected.get("audio_interleaved", []):
        content = [{"type": "text", "text": p["text"]} if "text" in p else audio_part(p["audio"]) for p in case["parts"]]
        embedding = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": content}]})["data"][0]["embedding"]
        results.append(("cosine", cosine(embedding, case["embedding"])))
    videos = [v for v in expected.get("video", []) if len(v["input_ids"]) <= 256]
    if videos:
        reply = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": [video_part(v["file"])]} for v in videos]})
        results += [("cosine", cosine(d["embedding"], v["embedding"])) for d, v in zip(reply["data"], videos)]
    for case in expected.get("video_interleaved", []):
        content = [video_part(p["video"]) if "video" in p else image_part(p["image"]) if "image" in p else {"type": "text", "text": p["text"]}
                   for p in case["parts"]]
        embedding = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": content}]})["data"][0]["embedding"]
        results.append(("cosine", cosine(embedding, case["embedding"])))
    return results


def video_part(file):
    """A vLLM `video_url` content part carrying a fixture video as a data URL."""
    import base64
    data = base64.b64encode(open(f"{FIXTURES}/video/{file}", "rb").read()).decode()
    return {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}}


def audio_part(file):
    """An OpenAI `input_audio` content part carrying a fixture audio file."""
    import base64
    data = base64.b64encode(open(f"{FIXTURES}/audio/{file}", "rb").read()).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": file.rsplit(".", 1)[-1]}}


def check_audio(server, expected):
    """An audio-only fixture (embeddinggemma2-audio16, 16 mel bins): each file alone, then both
    in one request."""
    cases = expected["audio"]
    results = []
    for case in cases:
        embedding = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": [audio_part(case["file"])]}]})["data"][0]["embedding"]
        results.append(("cosine", cosine(embedding, case["embedding"])))
    reply = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": [audio_part(c["file"])]} for c in cases]})
    results += [("cosine", cosine(d["embedding"], c["embedding"])) for d, c in zip(reply["data"], cases)]
    return results


def check_media_chat(server, expected):
    """EmbeddingGemma 2 whose folder ships a chat template (embeddinggemma2-second): each message
    of text, images and audio in both orders alone, then all in one request; then plain texts."""
    def content(parts):
        return [{"type": "text", "text": p["text"]} if "text" in p else image_part(p["image"]) if "image" in p
                else audio_part(p["audio"]) for p in parts]
    cases = expected["chat"]
    results = []
    for case in cases:
        embedding = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": content(case["parts"])}]})["data"][0]["embedding"]
        results.append(("cosine", cosine(embedding, case["embedding"])))
    reply = server.post("/v1/embeddings", {"messages": [{"role": "user", "content": content(c["parts"])} for c in cases]})
    results += [("cosine", cosine(d["embedding"], c["embedding"])) for d, c in zip(reply["data"], cases)]
    reply = server.post("/v1/embeddings", {"input": texts_of(expected["texts"])})
    results += [("cosine", cosine(d["embedding"], c["embedding"])) for d, c in zip(reply["data"], expected["texts"])]
    return results


def check_chat(server, expected):
    """The chat template's token ids (transformers' apply_chat_template), and a conversation's
    embedding equal to its rendered text's."""
    chat = expected["chat"]
    results = []
    for case in chat["cases"]:
        if case["template"] != "folder":
            continue
        body = {"messages": chat["conversations"][case["conversation"]], "add_generation_prompt": False}
        for key, value in case["options"].items():
            if key == "enable_thinking":
                body["chat_template_kwargs"] = {"enable_thinking": value}
            else:
                body[key] = value
        tokens = server.post("/tokenize", body)["tokens"]
        results.append(("diff", 0.0 if tokens == case["input_ids"] else float("inf")))
    case = chat["cases"][0]
    rendered = server.post("/v1/embeddings", {"input": case["text"], "add_special_tokens": False})["data"][0]["embedding"]
    chatted = server.post("/v1/embeddings", {"messages": chat["conversations"][case["conversation"]]})["data"][0]["embedding"]
    results.append(("cosine", cosine(rendered, chatted)))
    return results


def check_rewards(server, expected, key="token_rewards"):
    """Reward models: per-token rewards (or per-step probabilities) through /pooling token_classify."""
    results = []
    for case in expected["texts"]:
        rows = server.post("/pooling", {"input": case["text"], "task": "token_classify"})["data"][0]["data"]
        want = case[key]
        # Raw rewards are logits of any scale: their error is relative to the largest one.
        scale = max(1.0, max((abs(v) for w in want for v in w), default=1.0))
        results.append(("reward", max((max_abs_diff(r, w) for r, w in zip(rows, want)), default=0.0) / scale if len(rows) == len(want) else float("inf")))
    return results


PRM_STEP = ["--pooler-config", json.dumps({"pooling_type": "STEP", "step_tag_id": 1000, "returned_token_ids": [0, 1]})]
QWEN3_VL_RERANKER = json.dumps({"architectures": ["Qwen3VLForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                                "is_original_qwen3_reranker": True})
QWEN3_RERANKER = json.dumps({"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True})
SPLADE = ["--pooler-config", json.dumps({"pooling_type": "SPLADE"})]
GEMMA_RERANKER = json.dumps({"architectures": ["GemmaForSequenceClassification"], "classifier_from_token": ["Yes"], "method": "no_post_processing"})

# The adapter check_lora runs (the CUDA path of LoRA: composite candle products).
LORA_CHECKED = {"bert-embed-cls": "all-dense", "qwen3-embed-last": "all-proj"}


def lora_flags(base):
    adapter = LORA_CHECKED[base]
    return ["--enable-lora", "--lora-modules", f"{adapter}={FIXTURES}/lora/{base}/{adapter}"]


# Fixture folder → (extra server flags, checks).
CHECKS = {
    "bert-colbert": ([], [check_multi_vector]),
    "bert-embed-dense-dims": ([], [check_dense_dims]),
    "hf-colbert-tiny": ([], [check_multi_vector]),
    "bert-embed-cls": (lora_flags("bert-embed-cls"), [check_embeddings, lambda s, e: check_lora(s, e, "bert-embed-cls")]),
    "bert-embed-mean": ([], [check_embeddings]),
    "bert-embed-prompts": ([], [lambda s, e: check_embeddings(s, e, e["cases"]["default"])]),
    "bert-reranker": ([], [lambda s, e: check_classify(s, e, "sigmoid"), check_pairs]),
    "bert-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "bert-splade": (SPLADE, [check_sparse]),
    "bert-splade-st": ([], [check_sparse]),
    "bert-tokcls": ([], [check_token_classify]),
    "bge-m3-tiny": ([], [check_embeddings]),
    "clip-tiny": ([], [check_image_text]),
    "clip-second-tiny": ([], [check_image_text]),
    "colmodernvbert-engine-tiny": ([], [check_page_retriever]),
    "colmodernvbert-merged-tiny": ([], [check_page_retriever]),
    "colmodernvbert-tiny": ([], [check_page_retriever]),
    "colmodernvbert-second-tiny": ([], [check_page_retriever]),
    "colpali-tiny": ([], [check_page_retriever]),
    "colpali-second-tiny": ([], [check_page_retriever]),
    "colqwen2-tiny": ([], [check_page_retriever]),
    "colqwen2-eos-tiny": ([], [check_page_retriever]),
    "colqwen2-second-tiny": ([], [check_page_retriever]),
    "colqwen3-engine-tiny": ([], [check_page_retriever]),
    "colqwen3-tiny": ([], [check_page_retriever]),
    "colqwen3_5-tiny": ([], [check_page_retriever]),
    "deberta-embed": ([], [check_embeddings]),
    "deberta-reranker": ([], [check_pairs]),
    "deberta-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "deberta-tokcls": ([], [check_token_classify]),
    "distilbert-embed-mean-dense": ([], [check_embeddings]),
    "distilbert-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "electra-embed": ([], [check_embeddings]),
    "ernie-embed": ([], [check_embeddings]),
    "ernie-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "ernie-tokcls": ([], [check_token_classify]),
    "electra-reranker": ([], [check_pairs]),
    "electra-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "electra-tokcls": ([], [check_token_classify]),
    "embeddinggemma-tiny": ([], [check_embeddings]),
    "embeddinggemma2-text": ([], [check_embeddings]),
    "embeddinggemma2-omni": ([], [check_soft_token_images]),
    "embeddinggemma2-audio16": ([], [check_audio]),
    "embeddinggemma2-second": ([], [check_media_chat]),
    "gemma-causal-reranker": (["--hf-overrides", GEMMA_RERANKER], [check_pairs]),
    "gemma2-causal-lm": (["--runner", "generate"], [lambda s, e: check_generative(s, e, "gemma2-causal-lm")]),
    "gemma2-embed-last": ([], [check_embeddings]),
    "gemma2-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "gemma3-causal": ([], [check_embeddings]),
    "gritlm-tiny": ([], [check_embeddings]),
    "gte-embed-cls": ([], [check_embeddings]),
    "gte-en-v15-tiny": ([], [check_embeddings]),
    "gte-multilingual-reranker-tiny": ([], [check_pairs]),
    "gte-multilingual-tiny": ([], [check_embeddings]),
    "jina-code-embed": ([], [check_embeddings]),
    "jina-embed": ([], [check_embeddings]),
    "jina-colbert-v2-tiny": ([], [check_multi_vector]),
    "jina-reranker": ([], [check_pairs]),
    "jina-v3-tiny": ([], [check_tasks]),
    "jina-v5-nano-tiny": ([], [check_embeddings]),
    "jina-v5-small-tiny": ([], [check_embeddings]),
    "lfm2-colbert-tiny": ([], [check_multi_vector]),
    "llama-causal-lm": (["--runner", "generate"], [lambda s, e: check_generative(s, e, "llama-causal-lm")]),
    "llama-embed-last": ([], [check_embeddings]),
    "llama-nemotron-embed-tiny": ([], [check_embeddings]),
    "llama-nemotron-rerank-tiny": ([], [check_pairs]),
    "llama-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "mistral-embed-window": ([], [check_embeddings]),
    "modernbert-colbert-tiny": ([], [check_multi_vector]),
    "modernbert-embed-mean": ([], [check_embeddings]),
    "modernbert-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "mpnet-embed-masked-lm": ([], [check_embeddings]),
    "mpnet-embed-mean": ([], [check_embeddings]),
    "mpnet-seqcls": ([], [lambda s, e: check_classify(s, e, "softmax")]),
    "nemotron-colembed-tiny": ([], [check_page_retriever]),
    "nomic-embed-mean": ([], [check_embeddings]),
    "nomic-moe-tiny": ([], [check_embeddings]),
    "nomic-embed-t5": ([], [check_embeddings]),
    "ops-colqwen3-tiny": ([], [check_page_retriever]),
    "pplx-embed-tiny": ([], [check_embeddings]),
    "qwen2-embed-chat": ([], [check_embeddings, check_chat]),
    "qwen2-embed-last": ([], [check_embeddings]),
    "qwen2-process-reward": (PRM_STEP, [lambda s, e: check_rewards(s, e, "step_probs")]),
    "qwen2-reward": ([], [check_rewards]),
    "qwen3-causal-reranker": (["--hf-overrides", QWEN3_RERANKER], [check_pairs]),
    "qwen3-embed-last": (lora_flags("qwen3-embed-last"), [check_embeddings, lambda s, e: check_lora(s, e, "qwen3-embed-last")]),
    "qwen3-seqcls": ([], [lambda s, e: check_classify(s, e, "sigmoid"), check_pairs]),
    "qwen3-vl-embedding-tiny": ([], [check_chat_framed_images]),
    "qwen3-vl-embedding-second-tiny": ([], [check_chat_framed_images]),
    "qwen3-vl-reranker-tiny": (["--hf-overrides", QWEN3_VL_RERANKER], [check_image_pairs]),
    "siglip-tiny": ([], [check_image_text]),
    "siglip-second-tiny": ([], [check_image_text]),
    "voyage-nano-tiny": ([], [check_embeddings]),
    "xlmr-embed-cls": ([], [check_embeddings]),
    "xlmr-reranker": ([], [lambda s, e: check_classify(s, e, "sigmoid"), check_pairs]),
}


# Fixtures whose references share one file.
EXPECTED_FILE = {"llama-causal-lm": "generative-scoring", "gemma2-causal-lm": "generative-scoring"}


def torch_half(device):
    """How far transformers' own half-precision run of the reward fixtures is from its float32
    reference, by check_rewards' measure (raw logits relative to the largest): the fair bar for
    ours. Qwen2Model plus the `score` head, as tests/fixtures/make_reward_models.py builds them."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    for name, key in (("qwen2-reward", "token_rewards"), ("qwen2-process-reward", "step_probs")):
        folder = f"{FIXTURES}/models/{name}"
        config = json.load(open(f"{folder}/config.json"))
        qwen = transformers.Qwen2Config(**{k: v for k, v in config.items() if k not in ("architectures", "num_labels", "torch_dtype")})
        tensors = load_file(f"{folder}/model.safetensors")
        expected = json.load(open(f"{FIXTURES}/expected/{name}.json"))
        tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            backbone = transformers.Qwen2Model(qwen).eval()
            backbone.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
            h = config["hidden_size"]
            head = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, config["num_labels"])).eval()
            head.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("score.")})
            backbone, head = backbone.to(device, dtype), head.to(device, dtype)
            worst = 0.0
            with torch.no_grad():
                for case in expected["texts"]:
                    ids = tokenizer.encode(case["text"]).ids
                    logits = head(backbone(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0]).float().cpu()
                    if key == "step_probs":
                        rows = [torch.softmax(logits[i], -1).tolist() for i in case["step_positions"]]
                    else:
                        rows = logits.tolist()
                    want = case[key]
                    scale = max(1.0, max((abs(v) for w in want for v in w), default=1.0))
                    worst = max(worst, max((max_abs_diff(r, w) for r, w in zip(rows, want)), default=0.0) / scale)
            print(f"transformers {name:22} {str(dtype).split('.')[-1]:9} on {device}: max diff {worst:.2e} from the float32 reference", flush=True)


# Three times transformers' own bfloat16 distance from float32 on the reward fixtures (2.7e-2).
REWARD_BF16_BAR = 8e-2
# The page retrievers' tiny random weights (σ 0.2) amplify half precision: transformers' own
# ColPaliForRetrieval in bfloat16 gives a PNG page's worst row at cosine 0.8168 to its float32
# one (float16: 0.99836), ColQwen2ForRetrieval 0.99918 (float16: 0.99998), on Zen 5,
# 2026-11-27; ColModernVBertForRetrieval 0.99867 over its queries and PNG pages (float16:
# 0.99998); colpali-engine's ColQwen3_5 0.99324 (float16: 0.99558; its hybrid decoder's
# recurrence in half precision), 2026-11-28. Held to three times that distance where it is wider
# than the half bar.
HALF_COSINE = {("colpali-tiny", "bfloat16"): 0.45, ("colpali-tiny", "float16"): 0.995, ("colpali-second-tiny", "bfloat16"): 0.45,
               ("colpali-second-tiny", "float16"): 0.995, ("colqwen2-tiny", "bfloat16"): 0.9975,
               ("colqwen2-eos-tiny", "bfloat16"): 0.9975, ("colqwen2-second-tiny", "bfloat16"): 0.9975,
               ("colmodernvbert-tiny", "bfloat16"): 0.996, ("colmodernvbert-second-tiny", "bfloat16"): 0.996, ("colqwen3_5-tiny", "bfloat16"): 0.98}


def parity(binary, device, dtype):
    half = dtype in ("float16", "bfloat16") or (dtype == "auto" and device == "cuda")
    min_cosine, max_diff = (0.999, 1e-2) if half else (0.9999, 1e-4)
    # The reward fixtures' outputs (raw logits, and the PRM's step probabilities) in bfloat16:
    # transformers' own bfloat16 forward is 2.3e-2 to 2.7e-2 from its float32 one there
    # (`torch-half`: H200 and Zen 5, 2026-11-27), so 1e-2 is a bar the reference itself
    # misses. They are held to three times the reference's own distance instead.
    max_reward = REWARD_BF16_BAR if dtype == "bfloat16" else max_diff
    os.makedirs("target/gpu-check", exist_ok=True)
    folders = sorted(os.listdir(f"{FIXTURES}/models"))
    # FIXTURES_ONLY=a,b: those folders alone (a rerun of what failed, or a new family's check).
    if os.environ.get("FIXTURES_ONLY"):
        folders = [f for f in folders if f in os.environ["FIXTURES_ONLY"].split(",")]

    def check_folder(name):
        """One fixture folder: (ok, its report line)."""
        if name not in CHECKS:
            return False, f"FAIL {name}: no check in scripts/gpu_check.py for this fixture"
        flags, checks = CHECKS[name]
        expected = json.load(open(f"{FIXTURES}/expected/{EXPECTED_FILE.get(name, name)}.json"))
        for attempt in (1, 2):
            try:
                with Server(binary, f"{FIXTURES}/models/{name}", device, dtype, flags) as server:
                    results = [r for check in checks for r in check(server, expected)]
                    fell_back = device == "cuda" and server.kernels_fell_back()
                break
            except Exception as e:  # noqa: BLE001 (report every fixture, then fail)
                # A server that exited at start may have lost its port to a parallel one: once more.
                if attempt == 2 or "server exited" not in str(e):
                    return False, f"FAIL {name} {dtype}: {e}"
        cosines = [v for kind, v in results if kind == "cosine"]
        diffs = [v for kind, v in results if kind == "diff"]
        rewards = [v for kind, v in results if kind == "reward"]
        floor = min(min_cosine, HALF_COSINE.get((name, dtype), 1.0)) if half else min_cosine
        ok = (bool(results) and all(c >= floor for c in cosines) and all(d <= max_diff for d in diffs)
              and all(r <= max_reward for r in rewards) and not fell_back)
        diffs += rewards
        worst = []
        if cosines:
            worst.append(f"min cosine {min(cosines):.6f}")
        if diffs:
            worst.append(f"max diff {max(diffs):.2e}")
        if fell_back:
            worst.append("CUDA kernel self-check FAILED (ran composite ops)")
        return ok, f"{'ok  ' if ok else 'FAIL'} {name:28} {dtype:9} {len(results):3} checks, {', '.join(worst)}"

    # Several servers at once (PARITY_JOBS; each its own process and CUDA context): a GPU
    # machine's start-up cost is per server, and the machine time is short.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=int(os.environ.get("PARITY_JOBS", "1"))) as pool:
        reports = list(pool.map(check_folder, folders))
    for _, line in reports:
        print(line, flush=True)
    failures = sum(1 for ok, _ in reports if not ok)
    reward_note = f" (reward outputs <= {max_reward})" if max_reward != max_diff else ""
    print(f"parity {device} {dtype}: {len(folders) - failures} of {len(folders)} fixture models within cosine >= {min_cosine}, diff <= {max_diff}{reward_note}")
    return failures == 0


def st(corpus_path, model, device, dtype):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    texts = json.load(open(corpus_path))
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    encoder = SentenceTransformer(model, device=device, model_kwargs={"torch_dtype": torch_dtype})
    tokens = sum(len(ids) for ids in encoder.tokenizer(texts, truncation=True, max_length=encoder.max_seq_length)["input_ids"])
    batch = int(os.environ.get("ST_BATCH", "32"))
    encoder.encode(texts[: 4 * batch], batch_size=batch)  # warm-up (CUDA context, cuBLAS plans)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    encoder.encode(texts, batch_size=batch)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(f"sentence-transformers encode: {len(texts)} texts, batch {batch}, {dtype} on {device}")
    print(f"throughput {len(texts) / elapsed:.1f} sequences/s, {tokens / elapsed:.0f} tokens/s ({tokens} tokens in {elapsed:.2f} s)")


def real(binary, model, device):
    """A base-sized random folder (benches/make_family_models.py) against transformers'
    AutoModel on the same device: the shapes the tiny fixtures don't reach (EmbeddingGemma 2's
    heads of 256 and 512, inputs past its 512-token window). A server whose CUDA kernels failed
    their self-check fails here too. Token-id inputs (no tokenizer in
    the comparison), every token's vector (the token_embed task) and their mean. The reference
    is transformers in float64; its own float32 distance from it is printed first, to show the
    folder is well-conditioned enough for the bars: float32 cosine >= 0.9999, half precision
    >= 0.999. Then the time of one 8 x 128 and one 1 x 16 batch, transformers' forward vs our
    server's HTTP request (the request's queue and JSON included), medians of 20 in bfloat16,
    the dtype Gemma checkpoints are published in."""
    import random
    import statistics
    import torch
    from transformers import AutoModel

    rng = random.Random(0)
    ids = lambda n: [rng.randrange(1000, 30000) for _ in range(n)]  # noqa: E731
    inputs = [ids(16), ids(128), ids(600), ids(1100), ids(37)]  # 600 and 1100: past the 512 window
    name = os.path.basename(model)

    def reference(dtype):
        net = AutoModel.from_pretrained(model, dtype=dtype).to(device).eval()
        with torch.no_grad():
            rows = [net(input_ids=torch.tensor([x], device=device)).last_hidden_state[0].double().cpu() for x in inputs]
        return net, rows

    def worst(rows, want):
        """The smallest per-token cosine and the smallest cosine of the means."""
        tokens = min(float(torch.nn.functional.cosine_similarity(r, w, dim=-1).min()) for r, w in zip(rows, want))
        means = min(float(torch.nn.functional.cosine_similarity(r.mean(0), w.mean(0), dim=0)) for r, w in zip(rows, want))
        return tokens, means

    net, want = reference(torch.float64)
    del net
    net, theirs = reference(torch.float32)
    del net
    print(f"transformers float32 vs float64 on {name}: min cosine per token {worst(theirs, want)[0]:.6f}, "
          f"of the means {worst(theirs, want)[1]:.6f} (lengths {[len(x) for x in inputs]})", flush=True)
    ok = True
    ours = {}
    for dtype in ("float32", "float16", "bfloat16"):
        floor = 0.9999 if dtype == "float32" else 0.999
        with Server(binary, model, device, dtype, ["--pooler-config", json.dumps({"task": "token_embed"})]) as server:
            rows = [torch.tensor(d["data"], dtype=torch.float64) for d in server.post("/pooling", {"input": inputs, "task": "token_embed"})["data"]]
            alone = [torch.tensor(server.post("/pooling", {"input": [x], "task": "token_embed"})["data"][0]["data"], dtype=torch.float64) for x in inputs]
            shapes_ok = [r.shape for r in rows] == [w.shape for w in want] == [r.shape for r in alone]
            batched, single = (worst(rows, want), worst(alone, want)) if shapes_ok else ((0.0, 0.0), (0.0, 0.0))
            fell_back = device == "cuda" and server.kernels_fell_back()
            passed = shapes_ok and min(batched + single) >= floor and not fell_back
            ok &= passed
            print(f"{'ok  ' if passed else 'FAIL'} {name} {dtype:9} vs transformers float64: min cosine per token {min(batched[0], single[0]):.6f}, "
                  f"of the means {min(batched[1], single[1]):.6f} (batched and alone)"
                  f"{' CUDA kernel self-check FAILED (ran composite ops)' if fell_back else ''}", flush=True)
    with Server(binary, model, device, "bfloat16", []) as server:
        for shape in ((8, 128), (1, 16)):
            body = {"input": [ids(shape[1]) for _ in range(shape[0])]}
            times = []
            for i in range(25):
                start = time.perf_counter()
                server.post("/v1/embeddings", body)
                if i >= 5:
                    times.append(time.perf_counter() - start)
            ours[shape] = statistics.median(times)
    net, _ = reference(torch.bfloat16)
    for shape in ((8, 128), (1, 16)):
        x = torch.tensor([ids(shape[1]) for _ in range(shape[0])], device=device)
        times = []
        with torch.no_grad():
            for i in range(25):
                start = time.perf_counter()
                net(input_ids=x).last_hidden_state.float().mean(1).cpu()  # .cpu() waits for the device
                if i >= 5:
                    times.append(time.perf_counter() - start)
        theirs = statistics.median(times)
        print(f"speed {name} bfloat16 {shape[0]}x{shape[1]}: transformers forward {theirs * 1e3:.2f} ms, "
              f"poolserve request {ours[shape] * 1e3:.2f} ms, ratio {theirs / ours[shape]:.2f}x", flush=True)
    return ok


def matmul_parameters(model):
    """The parameters that take part in matrix products: the 2-D weights but the embedding tables
    (only looked up). Attention's own products (scores, weighted values) are not counted."""
    import struct
    with open(f"{model}/model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__" and len(t["shape"]) == 2 and "embed" not in name)


# Dense fp16/bf16 tensor-core peaks, NVIDIA's data sheets (without sparsity), by nvidia-smi name.
DENSE_FP16_PEAKS = [("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12)]


def table(out, dtype, concurrency, sizes):
    """The speed table: tokens/s (sequences/s), best to best against sentence-transformers, the
    model FLOP utilisation (tokens/s × 2 × matmul_parameters ÷ the dense fp16 peak) and the
    single request's p50 / p99; then the memory and parity summaries."""
    import glob
    import re

    def grab(path, pattern):
        try:
            m = re.search(pattern, open(path).read())
        except FileNotFoundError:
            return float("nan")
        return float(m.group(1)) if m else float("nan")

    device = open(f"{out}/device.txt").read().strip()
    peak = next((p for name, p in DENSE_FP16_PEAKS if name in device), float("nan"))
    print(f"GPU check on {device}; speed in {dtype}; MFU against {peak / 1e12:.0f} TFLOP/s dense fp16\n")
    print(f"| model | poolserve tokens/s (seq/s): {concurrency} × 1 input / 8 × 32 inputs | ST encode tokens/s (seq/s): batch 32 / 256 | best to best | MFU ours / ST | one 16-token request p50 / p99 |")
    print("|---|---|---|---|---|---|")
    labels = {"minilm": "MiniLM-L6 shape", "base": "BERT-base shape", "qwen3": "Qwen3-0.6B shape"}
    for size in sizes.split():
        params = matmul_parameters(f"{out}/{size}-random")
        ours = [f"{out}/load-{size}.txt", f"{out}/load32-{size}.txt"]
        theirs = [f"{out}/st-{size}-{b}.txt" for b in (32, 256)]
        tok = [grab(f, r"sequences/s, ([\d.]+) tokens/s") for f in ours]
        seq = [grab(f, r"throughput ([\d.]+) sequences/s") for f in ours]
        st_tok = [grab(f, r"sequences/s, ([\d.]+) tokens/s") for f in theirs]
        st_seq = [grab(f, r"throughput ([\d.]+) sequences/s") for f in theirs]
        p50 = grab(f"{out}/single-{size}.txt", r"latency p50 ([\d.]+) ms")
        p99 = grab(f"{out}/single-{size}.txt", r"p99 ([\d.]+) ms")
        def mfu(tokens_per_s):
            return 100 * tokens_per_s * 2 * params / peak
        print(f"| {labels[size]} ({params / 1e6:.0f}M in products) | {tok[0]:,.0f} ({seq[0]:,.0f}) / {tok[1]:,.0f} ({seq[1]:,.0f}) | {st_tok[0]:,.0f} ({st_seq[0]:,.0f}) / {st_tok[1]:,.0f} ({st_seq[1]:,.0f}) | {max(tok) / max(st_tok):.2f}× | {mfu(max(tok)):.1f}% / {mfu(max(st_tok)):.1f}% | {p50:.2f} / {p99:.2f} ms |")
    for path in sorted(glob.glob(f"{out}/memory-*.txt")):
        print("\n" + open(path).read().strip())
    for path in sorted(glob.glob(f"{out}/parity-*.txt")):
        for line in open(path):
            if line.startswith("parity"):
                print(f"\n{line.strip()}")


def device_memory_mib(device, pid):
    """Device memory in use now: the whole GPU's (nvidia-smi) on CUDA, the server's RSS on a CPU."""
    if device == "cuda":
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
        return float(out.split()[0])
    with open(f"/proc/{pid}/status") as f:
        return next(float(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def memory(binary, model, device, dtype, max_batch_tokens):
    """Peak device memory with `--max-batch-tokens` full of 512-token sequences, then the requests
    a careless client sends: more inputs than a request may hold, an input longer than the model,
    and one request of 1024 full-length inputs (many batches' worth, which must be split, not
    crash the GPU)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    long_text = " ".join(f"word{i % 97} token{i % 13}" for i in range(400))  # > 512 tokens, truncated
    idle = device_memory_mib(device, os.getpid()) if device == "cuda" else 0.0
    with Server(binary, model, device, dtype, ["--max-batch-tokens", str(max_batch_tokens)]) as server:
        loaded = device_memory_mib(device, server.process.pid)
        peak, stop = [loaded], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], device_memory_mib(device, server.process.pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        body = {"input": [long_text] * 32, "truncate_prompt_tokens": -1}
        requests = max(8, 4 * max_batch_tokens // (512 * 32))  # enough to fill every batch, four times
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=16) as pool:
            replies = list(pool.map(lambda _: server.post("/v1/embeddings", body), range(requests)))
        elapsed = time.perf_counter() - start
        tokens = sum(r["usage"]["prompt_tokens"] for r in replies)
        oversized = []
        for label, body in [
            ("2048 inputs in one request", {"input": ["hello"] * 2048}),
            ("one input of ~2000 tokens, no truncation", {"input": long_text * 2}),
            # Short words, so that the body stays under the 2 MB body limit.
            ("1024 full-length inputs in one request", {"input": ["a " * 600] * 1024, "truncate_prompt_tokens": -1}),
        ]:
            t = time.perf_counter()
            try:
                reply = server.post("/v1/embeddings", body)
                outcome = f"200, {len(reply['data'])} embeddings"
            except RuntimeError as e:
                outcome = str(e).replace("/v1/embeddings: ", "")[:200]
            oversized.append(f"  {label}: {outcome} ({time.perf_counter() - t:.2f} s)")
        alive = server.process.poll() is None
        stop.set()
        sampler.join()
    what = "GPU memory used (whole device)" if device == "cuda" else "server RSS"
    print(f"memory {os.path.basename(model)} --max-batch-tokens {max_batch_tokens} {dtype}: {what} idle {idle:.0f} MiB, loaded {loaded:.0f} MiB, peak {peak[0]:.0f} MiB under {requests} requests of 32 full-length inputs ({tokens / elapsed:.0f} tokens/s)")
    print("\n".join(oversized))
    print(f"  server {'still serving' if alive else 'DIED'} after the oversized requests")
    return alive


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "table":
        table(*sys.argv[2:])
        sys.exit(0)
    if len(sys.argv) == 7 and sys.argv[1] == "memory":
        sys.exit(0 if memory(*sys.argv[2:6], int(sys.argv[6])) else 1)
    if len(sys.argv) == 5 and sys.argv[1] == "parity":
        sys.exit(0 if parity(*sys.argv[2:]) else 1)
    if len(sys.argv) == 6 and sys.argv[1] == "st":
        st(*sys.argv[2:])
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "real":
        sys.exit(0 if real(*sys.argv[2:]) else 1)
    if len(sys.argv) == 3 and sys.argv[1] == "torch-half":
        torch_half(sys.argv[2])
        sys.exit(0)
    sys.exit(__doc__)
