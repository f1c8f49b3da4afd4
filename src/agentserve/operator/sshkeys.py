"""An Ed25519 SSH key pair in OpenSSH's formats, from 32 random bytes (pure; no crypto library).

The ranks of a worker spanning nodes are started by `mpirun` on the leader over SSH to its followers
(docs/kubernetes.md, "Workers spanning nodes"); the operator keeps one key pair per deployment in a
Secret. The operator image has no OpenSSH and the project no crypto dependency, so the public key is
derived here: Ed25519 key generation is a SHA-512 of the seed and one scalar multiplication on the
Edwards curve (RFC 8032, 5.1.5), and the file formats are OpenSSH's PROTOCOL.key and RFC 4253 strings.
Signing, the part that must resist side channels, is never done here: sshd and ssh do that.
"""

from __future__ import annotations

import base64
import hashlib
import struct

# Curve25519 in twisted Edwards form (RFC 8032, 5.1).
_P = 2**255 - 19
_D = (-121665 * pow(121666, _P - 2, _P)) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
Point = tuple[int, int, int, int]  # extended coordinates X, Y, Z, T with x = X/Z, y = Y/Z, xy = T/Z


def _recover_x(y: int, sign: int) -> int:
    """The x of a point from its y and the sign bit of x (RFC 8032, 5.1.3)."""
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = (u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P)) % _P
    if (v * x * x - u) % _P:
        x = (x * _SQRT_M1) % _P
    if x & 1 != sign:
        x = _P - x
    return x


_BY = (4 * pow(5, _P - 2, _P)) % _P
_BX = _recover_x(_BY, 0)
_BASE: Point = (_BX, _BY, 1, (_BX * _BY) % _P)
_ZERO: Point = (0, 1, 1, 0)


def _add(p: Point, q: Point) -> Point:
    """Point addition in extended coordinates (RFC 8032, 5.1.4)."""
    a = ((p[1] - p[0]) * (q[1] - q[0])) % _P
    b = ((p[1] + p[0]) * (q[1] + q[0])) % _P
    c = (2 * p[3] * q[3] * _D) % _P
    d = (2 * p[2] * q[2]) % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return ((e * f) % _P, (g * h) % _P, (f * g) % _P, (e * h) % _P)


def _multiply(scalar: int, point: Point) -> Point:
    result = _ZERO
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _encode(point: Point) -> bytes:
    x, y, z, _ = point
    zi = pow(z, _P - 2, _P)
    x, y = (x * zi) % _P, (y * zi) % _P
    return int.to_bytes(y | ((x & 1) << 255), 32, "little")


def public_key(seed: bytes) -> bytes:
    """The 32-byte Ed25519 public key of a 32-byte private seed (RFC 8032, 5.1.5)."""
    if len(seed) != 32:
        raise ValueError("an Ed25519 seed is 32 bytes")
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8  # clear the 3 low bits and bit 255
    a |= 1 << 254
    return _encode(_multiply(a, _BASE))


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


_KEY_TYPE = b"ssh-ed25519"


def _public_blob(public: bytes) -> bytes:
    return _string(_KEY_TYPE) + _string(public)


def authorized_key(seed: bytes, comment: str) -> str:
    """The public key as an authorized_keys / .pub line."""
    blob = base64.b64encode(_public_blob(public_key(seed))).decode()
    return f"ssh-ed25519 {blob} {comment}\n"


def private_key(seed: bytes, comment: str, check: int) -> str:
    """The private key in OpenSSH's format (unencrypted), as `ssh-keygen -t ed25519 -N ''` writes it.
    `check` is the 32-bit check word written twice (random in ssh-keygen; any value is valid)."""
    public = public_key(seed)
    section = struct.pack(">II", check, check)
    section += _string(_KEY_TYPE) + _string(public) + _string(seed + public) + _string(comment.encode())
    section += bytes(range(1, 1 + (-len(section)) % 8))  # padding 1, 2, 3, … to the 8-byte block
    body = b"openssh-key-v1\0" + _string(b"none") + _string(b"none") + _string(b"")
    body += struct.pack(">I", 1) + _string(_public_blob(public)) + _string(section)
    text = base64.b64encode(body).decode()
    lines = [text[i : i + 70] for i in range(0, len(text), 70)]
    return (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END OPENSSH PRIVATE KEY-----\n"
    )
