#!/usr/bin/env python3
"""Verify hint signatures the way TensorRT-LLM does (stdlib only).

Reads {"key": ..., "hints": [{role, model, conversation_id, affinity_header_hex,
request_type, disagg_request_id (decimal string or null), signature}]} on stdin;
rebuilds each payload as tensorrt_llm/serve/disagg_auth.py
_sign_subagent_affinity does (affinity id: the header bytes decoded as latin-1,
as Starlette does, then strip()) and compares with hmac.compare_digest.
Exits 1 naming the first hint that does not verify; prints "ok" otherwise.
"""
import hashlib
import hmac
import json
import sys


def main():
    req = json.load(sys.stdin)
    key = req["key"].encode("utf-8")
    for i, h in enumerate(req["hints"]):
        rid = h["disagg_request_id"]
        payload = {
            "purpose": "x-trtllm-subagent-affinity-id",
            "role": {"context": "CONTEXT", "generation": "GENERATION"}[h["role"]],
            "model": h["model"],
            "conversation_id": h["conversation_id"],
            "subagent_affinity_id": bytes.fromhex(h["affinity_header_hex"]).decode("latin-1").strip(),
            "request_type": h["request_type"],
            "disagg_request_id": None if rid is None else int(rid),
        }
        msg = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")
        want = "sha256=" + hmac.new(key, msg, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(h["signature"].encode("utf-8"), want.encode("utf-8")):
            print(f"hint {i}: signature {h['signature']} does not verify; message {msg!r}")
            sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
