"""Upload grants: the signed putUrl of s3 artifacts (azqueue.model.upload)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest

from azqueue.model.upload import PATH, UploadGrant, UploadSigner


def _grant(**changes: object) -> UploadGrant:
    grant = UploadGrant("fN1eZsTuQ4SfNaFNbbaSJA", 2, "public/logs/live log.txt",
                        "text/plain; charset=utf-8",
                        datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=30))
    return replace(grant, **changes)  # type: ignore[arg-type]


def _parsed(url: str) -> tuple[UploadGrant, str]:
    parts = urlsplit(url)
    assert parts.path == f"{PATH}/fN1eZsTuQ4SfNaFNbbaSJA/2/public%2Flogs%2Flive%20log.txt"
    return UploadGrant.from_query("fN1eZsTuQ4SfNaFNbbaSJA", 2, "public/logs/live log.txt",
                                  dict(parse_qsl(parts.query)))


@pytest.mark.parametrize("length", [None, 0, 12345])
def test_a_put_url_carries_its_grant_and_signature(length: int | None) -> None:
    signer = UploadSigner(("a-secret-of-16-chars-or-more",))
    grant = _grant(length=length)
    url = grant.url("https://queue.example.com", signer.sign(grant))
    assert url.startswith(f"https://queue.example.com{PATH}/")
    parsed, signature = _parsed(url)
    assert parsed == grant and signer.verify(parsed, signature)


@pytest.mark.parametrize("change", [
    {"task_id": "G8BNNbKHQaW_mUnbJ1ftAA"}, {"run_id": 3}, {"name": "public/other.txt"},
    {"content_type": "text/html"}, {"length": 5},
    {"expires": datetime(2099, 1, 1, tzinfo=UTC)}])
def test_a_grant_changed_in_any_field_fails_verification(change: dict[str, object]) -> None:
    signer = UploadSigner(("a-secret-of-16-chars-or-more",))
    signature = signer.sign(_grant())
    assert not signer.verify(_grant(**change), signature)


def test_every_secret_verifies_and_the_first_signs() -> None:
    old, new = "the-old-secret-0123456789", "the-new-secret-0123456789"
    grant = _grant()
    assert UploadSigner((new, old)).verify(grant, UploadSigner((old,)).sign(grant))
    assert not UploadSigner((new,)).verify(grant, UploadSigner((old,)).sign(grant))


@pytest.mark.parametrize("signature", ["", "not base64 at all!", "AAAA"])
def test_a_malformed_signature_fails_verification(signature: str) -> None:
    assert not UploadSigner(("a-secret-of-16-chars-or-more",)).verify(_grant(), signature)


@pytest.mark.parametrize("query, what", [
    ({"expires": "1", "signature": "x"}, "contentType"),
    ({"contentType": "a/b", "expires": "soon", "signature": "x"}, "malformed"),
    ({"contentType": "a/b", "expires": "1", "length": "ten", "signature": "x"}, "malformed"),
    ({"contentType": "a/b", "expires": "1"}, "signature")])
def test_a_query_that_is_not_a_put_urls_says_what_is_wrong(query: dict[str, str],
                                                           what: str) -> None:
    with pytest.raises(ValueError) as info:
        UploadGrant.from_query("fN1eZsTuQ4SfNaFNbbaSJA", 2, "public/x", query)
    assert what in str(info.value)
