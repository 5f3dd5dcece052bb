"""Signed DHT records: every record of a run is signed by its writer and admitted on store and read.

``SignedRecords`` is a hivemind record validator (it runs inside the DHT process). On store it wraps
each value as msgpack ``[value, public key, token, signature]``, the signature covering the record's
DHT key, subkey, value and expiration under the run ID. On every store request from another node
and on every record another node returns, it checks:

* the value is at most ``max_value`` bytes and decodes within bounds;
* the subkey is the writer's peer ID: the embedded public key hashes to it and signed the record
  (so a subkey cannot be taken in another peer's name, a writer has one subkey per key, and the
  leader of a round's group record is whoever signed it);
* the writer is admitted (``peers.trust.admission``; the token travels in the record).

A record failing any check is neither stored nor returned: a non-admitted node can write only to its
own storage, and whoever reads from it drops what it returns. Regular values (no subkey) are refused:
every record the project writes has its writer's peer ID as subkey.
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from peers.keys.signing import MAX_PUBLIC_DER, Signer, verify_signed_by
from peers.trust.admission import MAX_TOKEN_BYTES, Admission
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.safe_msgpack import unpack

__all__ = ["SignedRecords", "MAX_RECORD_BYTES"]

logger = logging.getLogger(__name__)
#: the largest value (before signing) a record may have: a peer record with its multiaddrs, a
#: suspicion table of 1024 peers, a group list of 1024 members all fit
MAX_RECORD_BYTES = 64 * 1024
_DOMAIN = b"swarmtrain-dht-record-v1\0"


def _signed_bytes(run_id: str, record: DHTRecord, value: bytes) -> bytes:
    head = [run_id, record.key, record.subkey, float(record.expiration_time)]
    return _DOMAIN + bytes(msgpack.packb(head, use_bin_type=True)) + value


class SignedRecords(RecordValidatorBase):
    """Signs this peer's records and admits other peers' (see the module docstring).

    Args:
        signer: this peer's identity key (its peer ID is the subkey of everything it writes).
        admission: the run's policy.
        token: this peer's join token (policy ``token``), shown in every record it writes.
        max_value: the largest value before signing, in bytes.
    """

    def __init__(
        self,
        signer: Signer,
        admission: Admission,
        token: bytes | None = None,
        max_value: int = MAX_RECORD_BYTES,
    ) -> None:
        self.signer = signer
        self.admission = admission
        self.token = token or b""
        self.max_value = max_value
        self._limit = max_value + 2 * MAX_PUBLIC_DER + MAX_TOKEN_BYTES + 64

    def sign_value(self, record: DHTRecord) -> bytes:
        sig = self.signer.sign(_signed_bytes(self.admission.run_id, record, record.value))
        out = [record.value, self.signer.public_der, self.token, sig]
        return bytes(msgpack.packb(out, use_bin_type=True))

    def _open(self, record: DHTRecord) -> tuple[bytes, bytes, bytes, bytes]:
        if len(record.value) > self._limit:
            raise ProtocolError("record too large")
        obj = unpack(record.value, what="DHT record", max_bytes=self._limit, max_bin=self._limit, max_array=4)
        if not (isinstance(obj, list) and len(obj) == 4 and all(isinstance(x, bytes) for x in obj)):
            raise ProtocolError("record is not [value, key, token, signature]")
        value, der, token, sig = obj
        if len(value) > self.max_value:
            raise ProtocolError("record value too large")
        return value, der, token, sig

    def check(self, record: DHTRecord) -> bytes:
        """The record's value if it passes every check.

        Raises:
            ProtocolError: it does not (``NotAdmitted`` for a writer the policy keeps out).
        """
        value, der, token, sig = self._open(record)
        writer = unpack(record.subkey, what="record subkey", max_bytes=256, max_str=128)
        if not isinstance(writer, str) or not writer:
            raise ProtocolError("record subkey is not a peer ID")
        verify_signed_by(writer, der, _signed_bytes(self.admission.run_id, record, value), sig)
        self.admission.check(writer, token or None)
        return value

    def validate(self, record: DHTRecord) -> bool:
        try:
            self.check(record)
        except ProtocolError as e:
            logger.debug("refused a DHT record: %s", e)
            return False
        return True

    def strip_value(self, record: DHTRecord) -> bytes:
        return self._open(record)[0]

    @property
    def priority(self) -> int:
        return 10

    def merge_with(self, other: Any) -> bool:
        return False
