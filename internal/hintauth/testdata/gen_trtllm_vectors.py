#!/usr/bin/env python3
"""Generate trtllm_vectors.json: TensorRT-LLM's hint and KV-transfer
signatures computed with Python's own json and hmac modules (stdlib only).

The payloads are built exactly as TensorRT-LLM's
tensorrt_llm/serve/disagg_auth.py does (_sign_subagent_affinity and
_auth_payload): json.dumps(payload, sort_keys=True, separators=(",", ":"))
with the default ensure_ascii, encoded as UTF-8, HMAC-SHA256 with the key
encoded as UTF-8, "sha256=" + hexdigest().

The subagent affinity id reaches a worker as an HTTP header, which
Starlette decodes as latin-1 and TensorRT-LLM strips: each vector gives the
header bytes (hex) and Python computes the id from them the same way.

Run: python3 gen_trtllm_vectors.py > trtllm_vectors.json
"""
import hashlib
import hmac
import json
import sys

KEY = "tether-test-key-0123456789abcdef"
PURPOSE = "x-trtllm-subagent-affinity-id"


def sign(key, payload):
    msg = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return msg, "sha256=" + hmac.new(key.encode("utf-8"), msg, hashlib.sha256).hexdigest()


# role, model, conversation_id (None: null), header bytes of the affinity
# id, request_type (None: null), disagg_request_id (None: null)
HINTS = [
    ("context", "llama-3.1-70b", "child-a", b"parent-1", "context_only", 42),
    ("generation", "llama-3.1-70b", "child-a", b"parent-1", "generation_only", 42),
    ("generation", "m", "child", b"root", None, None),
    ("context", "m\u00e9t\u00e9o-\u6a21\u578b", "enfant-\u00e9\u00e8", b"p\xe9re", "context_only", 7),
    ("context", "m", 'q"uo\\te/sl', b'pa"r\\ent', "context_only", 1),
    ("context", "m", "ctl\n\r\t\b\f\x00\x01\x1f\x7f end", b"p\x7fx", "context_only", 0),
    ("context", "m", "emoji \U0001F600 \U0001F9D1\u200d\U0001F4BB", b"parent", "context_only", 2**63 + 12345),
    ("context", "m", "tags <b> & </b>", b"<a>&b", "context_only", 18446744073709551617),
    ("context", "m", "line\u2028sep\u2029 \ufeff bom", b"  padded parent \t", "context_only", 3),
    ("generation", "m", None, b"parent", "generation_only", None),
    ("context", "m", "null-id", b"parent", "context_only", -5),
    ("context", "", "c", b"\xa0latin1 nbsp\xa0", "context_only", 9),
]

# ctx_info_endpoint, encoded_opaque_state (raw JSON as the request body has them)
DISAGG = [
    ('"tcp://10.0.0.7:5555"', '"c3RhdGU="'),
    ('["tcp://a:1", "tcp://b:2"]', '"c3RhdGU="'),
    ("[]", '"x"'),
    ("null", '"only-state \u00e9 <&>"'),
    ('"ep-\U0001F600"', "null"),
    ("null", "null"),
]


def main():
    out = {"key": KEY, "hints": [], "disagg": []}
    for role, model, conv, hdr, rtype, rid in HINTS:
        affinity = hdr.decode("latin-1").strip()
        payload = {
            "purpose": PURPOSE,
            "role": {"context": "CONTEXT", "generation": "GENERATION"}[role],
            "model": model,
            "conversation_id": conv,
            "subagent_affinity_id": affinity,
            "request_type": rtype,
            "disagg_request_id": rid,
        }
        msg, sig = sign(KEY, payload)
        out["hints"].append({
            "role": role,
            "model": model,
            "conversation_id": conv,
            "affinity_header_hex": hdr.hex(),
            "request_type": rtype,
            "disagg_request_id": None if rid is None else str(rid),
            "message": msg.decode("ascii"),
            "signature": sig,
        })
    for ep_raw, st_raw in DISAGG:
        ep, st = json.loads(ep_raw), json.loads(st_raw)
        if isinstance(ep, list):
            ep = ep[0] if ep else None
        need = json.loads(ep_raw) is not None or st is not None
        msg, sig = sign(KEY, {"ctx_info_endpoint": ep, "encoded_opaque_state": st})
        out["disagg"].append({
            "ctx_info_endpoint": ep_raw,
            "encoded_opaque_state": st_raw,
            "need": need,
            "message": msg.decode("ascii"),
            "signature": sig,
        })
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
