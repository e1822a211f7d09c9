"""v2proxy.http.head.check_head without sockets: one table of heads as llhttp hands them over
(version, method, target, lowercased fields, whether it would switch protocols) and what the
server makes of them: the framing facts, or the status and message it refuses them with."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from v2proxy.http.head import FieldNames, Head, Rejection, check_head, fields_over, fields_size

MAX_BODY = 1000
H = list[tuple[bytes, bytes]]


@dataclass
class Parsed:
    """Stands in for httptools' parser after a head."""

    version: str = "1.1"
    method: bytes = b"GET"
    upgrade: bool = False

    def get_http_version(self) -> str:
        return self.version

    def get_method(self) -> bytes:
        return self.method

    def should_upgrade(self) -> bool:
        return self.upgrade


V11, V10 = (1, 1), (1, 0)
CL = (b"content-length", b"10")
TE = (b"transfer-encoding", b"chunked")
EXPECT = (b"expect", b"100-continue")
UPGRADE = (b"upgrade", b"h2c")
GET = Parsed()
SWITCHING = Parsed(upgrade=True)  # llhttp saw Upgrade and Connection: upgrade

V505 = "HTTP version not supported; use HTTP/1.1"
ORIGIN = "the request target must be a path (origin-form)"
CODING = "only the chunked transfer coding is supported"
EXPECTATION = "only 'Expect: 100-continue' is supported"
BOTH = "Content-Length together with Transfer-Encoding"
UPGRADE_BODY = "an Upgrade request cannot have a body here"
TE_10 = "Transfer-Encoding is not allowed in an HTTP/1.0 request"

# id, parser, target, fields -> (method, version, content_length, chunked, keep_alive, expect)
ACCEPTED: list[tuple[str, Parsed, bytes, H, Head]] = [
    ("get 1.1", GET, b"/", [], ("GET", V11, None, False, True, False)),
    ("get 1.0", Parsed("1.0"), b"/", [], ("GET", V10, None, False, False, False)),
    (
        "1.0 keep-alive",
        Parsed("1.0"),
        b"/",
        [(b"connection", b"Keep-Alive")],
        ("GET", V10, None, False, True, False),
    ),
    (
        "close among tokens",
        GET,
        b"/",
        [(b"connection", b"foo, Close")],
        ("GET", V11, None, False, False, False),
    ),
    (
        "close beats keep-alive",
        GET,
        b"/",
        [(b"connection", b"keep-alive"), (b"connection", b"close")],
        ("GET", V11, None, False, False, False),
    ),
    (
        "post with length",
        Parsed(method=b"POST"),
        b"/x?a=1",
        [CL],
        ("POST", V11, 10, False, True, False),
    ),
    (
        "length at the limit",
        GET,
        b"/",
        [(b"content-length", b"1000")],
        ("GET", V11, 1000, False, True, False),
    ),
    ("chunked", GET, b"/", [TE], ("GET", V11, None, True, True, False)),
    (
        "chunked, any case",
        GET,
        b"/",
        [(b"transfer-encoding", b" Chunked ")],
        ("GET", V11, None, True, True, False),
    ),
    (
        "expect with body",
        GET,
        b"/",
        [(b"expect", b"100-Continue"), CL],
        ("GET", V11, 10, False, True, True),
    ),
    ("expect without body", GET, b"/", [EXPECT], ("GET", V11, None, False, True, False)),
    (
        "expect, zero length",
        GET,
        b"/",
        [EXPECT, (b"content-length", b"0")],
        ("GET", V11, 0, False, True, False),
    ),
    (
        "expect on 1.0 ignored",
        Parsed("1.0"),
        b"/",
        [EXPECT, CL],
        ("GET", V10, 10, False, False, False),
    ),
    ("upgrade without body", SWITCHING, b"/", [UPGRADE], ("GET", V11, None, False, True, False)),
    ("upgrade, no switch", GET, b"/", [UPGRADE, CL], ("GET", V11, 10, False, True, False)),
    (
        "other method",
        Parsed(method=b"PROPFIND"),
        b"/",
        [],
        ("PROPFIND", V11, None, False, True, False),
    ),
]

# id, parser, target, fields -> status, message
REFUSED: list[tuple[str, Parsed, bytes, H, int, str]] = [
    ("http/2.0", Parsed("2.0"), b"/", [], 505, V505),
    ("http/0.9", Parsed("0.9"), b"/", [], 505, V505),
    ("version checked first", Parsed("2.0", b"CONNECT"), b"h:1", [], 505, V505),
    ("connect", Parsed(method=b"CONNECT"), b"h:443", [], 400, "CONNECT is not supported"),
    ("absolute-form", GET, b"http://h/", [], 400, ORIGIN),
    ("asterisk", Parsed(method=b"OPTIONS"), b"*", [], 400, ORIGIN),
    ("empty target", GET, b"", [], 400, ORIGIN),
    ("gzip coding", GET, b"/", [(b"transfer-encoding", b"gzip, chunked")], 501, CODING),
    ("other expectation", GET, b"/", [(b"expect", b"200-ok")], 417, EXPECTATION),
    (
        "first field wins",
        GET,
        b"/",
        [(b"expect", b"x"), (b"transfer-encoding", b"gzip")],
        417,
        EXPECTATION,
    ),
    ("length with chunked", GET, b"/", [CL, TE], 400, BOTH),
    ("chunked on 1.0", Parsed("1.0", b"POST"), b"/", [TE], 400, TE_10),
    (
        "chunked on 1.0, keep-alive",
        Parsed("1.0"),
        b"/",
        [(b"connection", b"keep-alive"), TE],
        400,
        TE_10,
    ),
    ("gzip coding on 1.0", Parsed("1.0"), b"/", [(b"transfer-encoding", b"gzip")], 400, TE_10),
    ("length and chunked on 1.0", Parsed("1.0"), b"/", [CL, TE], 400, TE_10),
    (
        "length over the limit",
        GET,
        b"/",
        [(b"content-length", b"1001")],
        413,
        "request body larger than 1000 bytes",
    ),
    ("both before 413", GET, b"/", [(b"content-length", b"5000"), TE], 400, BOTH),
    ("upgrade with length", SWITCHING, b"/", [UPGRADE, CL], 400, UPGRADE_BODY),
    ("upgrade with chunked", SWITCHING, b"/", [UPGRADE, TE], 400, UPGRADE_BODY),
]


@pytest.mark.parametrize(
    ("parsed", "target", "headers", "want"),
    [c[1:] for c in ACCEPTED],
    ids=[c[0] for c in ACCEPTED],
)
def test_accepted(parsed: Parsed, target: bytes, headers: H, want: Head) -> None:
    assert check_head(parsed, target, headers, MAX_BODY) == want


@pytest.mark.parametrize(
    ("parsed", "target", "headers", "status", "message"),
    [c[1:] for c in REFUSED],
    ids=[c[0] for c in REFUSED],
)
def test_refused(parsed: Parsed, target: bytes, headers: H, status: int, message: str) -> None:
    with pytest.raises(Rejection) as info:
        check_head(parsed, target, headers, MAX_BODY)
    assert (info.value.status, info.value.message) == (status, message)


def _keeps_alive(parsed: Parsed, headers: H) -> bool:
    """What llhttp's should_keep_alive() says after such a head: HTTP/1.1 unless a Connection
    or Proxy-Connection field says close; any other version only with keep-alive there."""
    tokens = b",".join(v.lower() for n, v in headers if n in (b"connection", b"proxy-connection"))
    if parsed.version == "1.1":
        return b"close" not in tokens
    return b"keep-alive" in tokens


def _outcome(parsed: Parsed, target: bytes, headers: H, keeps_alive: bool) -> object:
    try:
        return check_head(parsed, target, headers, MAX_BODY, keeps_alive)
    except Rejection as exc:
        return (exc.status, exc.message)


@pytest.mark.parametrize(
    ("parsed", "target", "headers"),
    [c[1:4] for c in ACCEPTED + REFUSED]
    + [
        (Parsed("1.0"), b"/", [(b"proxy-connection", b"keep-alive")]),
        (Parsed("2.0"), b"/", [(b"proxy-connection", b"keep-alive"), TE]),
        (Parsed("0.9"), b"/", [(b"transfer-encoding", b"gzip"), (b"connection", b"keep-alive")]),
    ],
)
def test_keeps_alive_hint(parsed: Parsed, target: bytes, headers: H) -> None:
    """llhttp's keep-alive verdict spares asking for the version; the outcome is the same."""
    hint = _keeps_alive(parsed, headers)
    assert _outcome(parsed, target, headers, hint) == _outcome(parsed, target, headers, False)


@dataclass
class Unversioned(Parsed):
    def get_http_version(self) -> str:
        raise AssertionError("the version was asked")


def test_keeps_alive_hint_skips_the_version() -> None:
    head = check_head(Unversioned(method=b"POST"), b"/", [CL, (b"host", b"h")], MAX_BODY, True)
    assert head == ("POST", V11, 10, False, True, False)


# ------------------------------------------------------------------ the fields' limits

_F = (b"x-a", b"12345")  # 3 + 5 + 4 = 12 bytes in a head


@pytest.mark.parametrize(
    "fields,max_bytes,max_fields,expected",
    [
        ([], 0, 0, None),
        ([_F] * 3, 36, 3, None),  # exactly at both limits
        ([_F] * 4, 36, 10, (431, "request head too large")),
        ([_F] * 4, 100, 3, (431, "too many header fields")),
        # both crossed: the one the fields crossed first wins
        ([_F] * 5, 30, 3, (431, "request head too large")),  # bytes at the 3rd field
        ([_F] * 5, 48, 2, (431, "too many header fields")),  # count at the 3rd
    ],
)
def test_fields_over(
    fields: list[tuple[bytes, bytes]],
    max_bytes: int,
    max_fields: int,
    expected: tuple[int, str] | None,
) -> None:
    assert fields_size(fields) == 12 * len(fields)
    assert fields_over(fields, max_bytes, max_fields) == expected


# ------------------------------------------------------------------ field names


@pytest.mark.parametrize(
    "heads",
    [
        # the same names head after head (the usual peer)
        [[b"Host", b"Content-Type", b"Content-Length"]] * 3,
        # another name at a place, fewer names, more names, a name moved
        [
            [b"Host", b"Content-Type", b"Content-Length"],
            [b"Host", b"X-Request-ID", b"Content-Length"],
            [b"HOST"],
            [b"host", b"Accept", b"content-type", b"Content-Length", b"X-A"],
            [b"X-A", b"host"],
            [b"Host", b"Content-Type", b"Content-Length"],
        ],
        # more names than a connection keeps
        [[b"X-%d" % i for i in range(80)]] * 2,
    ],
)
def test_field_names_are_lowercased_whatever_came_before(heads: list[list[bytes]]) -> None:
    """Each head's names come out lowercased, as ``bytes.lower`` says, whichever names the
    connection's earlier heads held at each place."""
    names = FieldNames()
    for head in heads:
        got = [names.lower(k, bytes(name)) for k, name in enumerate(head)]  # (new objects)
        assert got == [name.lower() for name in head]
    assert len(names.came) == len(names.lowered) <= 64
