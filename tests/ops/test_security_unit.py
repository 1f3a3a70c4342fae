"""shared/security.py: API keys, bearer parsing, rate limits, TLS contexts,
config validation of the security fields."""
from __future__ import annotations

import ssl

import pytest

from dspark.shared import errors
from dspark.shared.config import RouterConfig, SchedulerConfig
from dspark.shared.security import (
    ApiKeys,
    Gate,
    RateLimiter,
    RateLimited,
    ServerTLS,
    bearer_token,
    key_name,
)

from .certs import make_pki

KEY_A = "sk-test-aaaaaaaaaaaaaaaa"
KEY_B = "sk-test-bbbbbbbbbbbbbbbb"


def keys_file(tmp_path, text):
    p = tmp_path / "keys.txt"
    p.write_text(text)
    return str(p)


def test_api_keys_file_names_and_matches(tmp_path):
    keys = ApiKeys.from_file(keys_file(tmp_path, f"# team keys\nalice {KEY_A}\n\n{KEY_B}\n"))
    assert len(keys) == 2
    assert keys.match(KEY_A) == "alice"
    assert keys.match(KEY_B) == key_name(KEY_B) and KEY_B not in key_name(KEY_B)
    assert keys.match(KEY_A[:-1]) is None
    assert keys.match(KEY_A + "x") is None
    assert keys.match("") is None and keys.match(None) is None


@pytest.mark.parametrize("text,words", [
    ("", "holds no key"),
    ("short\n", "at least 16 characters"),
    (f"a b {KEY_A}\n", "must be KEY or NAME KEY"),
    (f"a {KEY_A} rps=fast\n", "rps='fast' must be a number"),
    (f"a {KEY_A} colour=red\n", "unknown option 'colour'"),
    (f"a {KEY_A} max_request_bytes=10\n", "max_request_bytes=10 must be >= 1024"),
])
def test_bad_keys_files(tmp_path, text, words):
    with pytest.raises(ValueError, match=words):
        ApiKeys.from_file(keys_file(tmp_path, text))


def test_keys_compared_in_constant_time(monkeypatch, tmp_path):
    """Every configured key is compared with hmac.compare_digest, no early exit."""
    import dspark.shared.security as sec

    calls = []
    real = sec.hmac.compare_digest
    monkeypatch.setattr(sec.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    keys = ApiKeys.from_file(keys_file(tmp_path, f"{KEY_A}\n{KEY_B}\n"))
    assert keys.match(KEY_A) is not None
    assert len(calls) == 2


@pytest.mark.parametrize("header,token", [
    (f"Bearer {KEY_A}", KEY_A), (f"bearer  {KEY_A} ", KEY_A), ("Basic abc", None),
    ("Bearer", None), ("", None), (None, None)])
def test_bearer_token(header, token):
    assert bearer_token(header) == token


def test_rate_limiter_token_bucket():
    rl = RateLimiter(rate=2.0, burst=3)
    assert [rl.acquire("k", now=10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rl.acquire("k", now=10.0) == pytest.approx(0.5)  # empty: one token per 0.5 s
    assert rl.acquire("other", now=10.0) == 0.0  # buckets are per key
    assert rl.acquire("k", now=10.5) == 0.0
    assert not RateLimiter(0).enabled and RateLimiter(0).acquire("k") == 0.0


def test_gate(tmp_path):
    keys = ApiKeys.from_file(keys_file(tmp_path, f"alice {KEY_A}\n"))
    gate = Gate(keys, RateLimiter(rate=1.0, burst=1))
    with pytest.raises(errors.Unauthenticated, match="missing API key"):
        gate.admit(None)
    with pytest.raises(errors.Unauthenticated, match="invalid API key") as e:
        gate.admit(KEY_B)
    assert KEY_B not in str(e.value)
    assert gate.admit(KEY_A) == "alice"
    with pytest.raises(RateLimited, match="at most 1 requests/s per API key") as e:
        gate.admit(KEY_A)
    assert isinstance(e.value, errors.ResourceExhausted) and e.value.retry_after > 0
    assert gate.admit(KEY_A, limited=False) == "alice"  # e.g. /v1/models
    assert Gate(None, RateLimiter(0)).admit(None) == "anonymous"


def test_tls_config_validation(tmp_path):
    pki = make_pki(tmp_path)
    with pytest.raises(ValueError, match="tls_key='' is invalid: must be set together"):
        RouterConfig(tls_cert=pki.server_cert)
    with pytest.raises(ValueError, match="tls_client_ca=.* used with tls_cert"):
        SchedulerConfig(tls_client_ca=pki.ca)
    with pytest.raises(ValueError, match="tls_cert='/nope.pem' is invalid: must be a readable"):
        RouterConfig(tls_cert="/nope.pem", tls_key=pki.server_key)
    with pytest.raises(ValueError, match="tls_client_cert=.* used with tls_ca"):
        RouterConfig(tls_client_cert=pki.client_cert, tls_client_key=pki.client_key)
    with pytest.raises(ValueError, match="api_keys_file"):
        RouterConfig(api_keys_file=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="metrics_port=70000 is invalid"):
        RouterConfig(metrics_port=70000)
    with pytest.raises(ValueError, match="drain_timeout=-1 is invalid"):
        RouterConfig(drain_timeout=-1)
    ok = RouterConfig(tls_cert=pki.server_cert, tls_key=pki.server_key, tls_client_ca=pki.ca,
                      tls_ca=pki.ca, tls_client_cert=pki.client_cert,
                      tls_client_key=pki.client_key)
    assert ok.tls_client_ca == pki.ca


def test_server_ssl_context_requires_client_cert_when_mutual(tmp_path):
    pki = make_pki(tmp_path)
    ctx = ServerTLS(pki.server_cert, pki.server_key, pki.ca).ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ServerTLS(pki.server_cert, pki.server_key).ssl_context().verify_mode == ssl.CERT_NONE


def test_services_bind_loopback_by_default():
    from dspark.shared.config import WorkerConfig

    for cfg in (RouterConfig(), SchedulerConfig(), WorkerConfig()):
        assert cfg.host == "127.0.0.1"
    assert RouterConfig().http_port == 0 and RouterConfig().metrics_port == 0


def test_per_key_limits(tmp_path):
    from dspark.shared.security import KeyLimits, RequestTooLarge

    keys = ApiKeys.from_file(keys_file(
        tmp_path, f"big {KEY_A} rps=100 burst=100\nsmall {KEY_B} rps=1 max_request_bytes=2048\n"))
    assert keys.limits["small"] == KeyLimits(rps=1.0, burst=None, max_request_bytes=2048)
    gate = Gate(keys, RateLimiter(rate=2.0, burst=2))
    assert [gate.admit(KEY_A) for _ in range(50)] == ["big"] * 50  # its own, higher limit
    assert gate.admit(KEY_B) == "small"
    with pytest.raises(RateLimited, match="at most 1 requests/s"):
        gate.admit(KEY_B)
    gate.check_size("small", 2048)
    with pytest.raises(RequestTooLarge, match="2049 bytes is over max_request_bytes=2048"):
        gate.check_size("small", 2049)
    gate.check_size("big", 10**6)  # no own size limit: the server's applies


def test_bad_pem_is_a_clear_error(tmp_path):
    pki = make_pki(tmp_path)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="tls_cert=.* is invalid: not a matching PEM"):
        ServerTLS(str(bad), pki.server_key).ssl_context()
    with pytest.raises(ValueError, match="not a matching PEM"):  # key of another cert
        ServerTLS(pki.server_cert, pki.client_key).ssl_context()
    with pytest.raises(ValueError, match="tls_client_ca=.* is invalid"):
        ServerTLS(pki.server_cert, pki.server_key, str(bad)).ssl_context()
