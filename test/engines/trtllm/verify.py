#!/usr/bin/env python3
"""TensorRT-LLM's signature checks, stdlib only, for the trtllm-serve stand-in.

Independent of tether's Go implementation (internal/hintauth): the payloads are
built as tensorrt_llm/serve/disagg_auth.py builds them
(_sign_subagent_affinity, _auth_payload) and compared with
hmac.compare_digest. One JSON request per stdin line, one JSON answer per
stdout line: {"ok": true} or {"ok": false, "message": "..."}.

Requests:
  {"kind": "hint", "key", "role": "CONTEXT"|"GENERATION", "model",
   "conversation_id", "affinity_header_hex", "request_type",
   "disagg_request_id", "signature"}
  {"kind": "disagg", "key", "ctx_info_endpoint", "encoded_opaque_state",
   "signature"}
  {"kind": "disagg-params", "key", "params", "fields", "signature"}
"""
import hashlib
import hmac
import json
import sys


def sign(key, payload):
    msg = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return "sha256=" + hmac.new(key.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def check(req):
    if req["kind"] == "hint":
        # Starlette decodes header bytes as latin-1; TensorRT-LLM strips.
        affinity = bytes.fromhex(req["affinity_header_hex"]).decode("latin-1").strip()
        payload = {
            "purpose": "x-trtllm-subagent-affinity-id",
            "role": req["role"],
            "model": req["model"],
            "conversation_id": req["conversation_id"],
            "subagent_affinity_id": affinity,
            "request_type": req["request_type"],
            "disagg_request_id": req["disagg_request_id"],
        }
        failure = "Invalid internal subagent affinity authentication"
    elif req["kind"] == "disagg-params":
        # The first releases with x-trtllm-disagg-auth signed the whole
        # DisaggregatedParams: model_dump(mode="json", exclude_none=False),
        # every declared field, None for those not sent.
        params = req["params"]
        payload = {name: params.get(name) for name in req["fields"]}
        failure = "Invalid internal disaggregated request authentication"
    else:
        endpoint = req["ctx_info_endpoint"]
        if isinstance(endpoint, list):
            endpoint = endpoint[0] if endpoint else None
        payload = {"ctx_info_endpoint": endpoint, "encoded_opaque_state": req["encoded_opaque_state"]}
        failure = "Invalid internal disaggregated request authentication"
    provided = req.get("signature")
    expected = sign(req["key"], payload)
    if provided is None or not hmac.compare_digest(provided.encode("utf-8"), expected.encode("utf-8")):
        return {"ok": False, "message": failure}
    return {"ok": True}


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            out = check(json.loads(line))
        except Exception as exc:  # a bad request is an answer, not a crash
            out = {"ok": False, "message": f"verifier error: {exc}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
