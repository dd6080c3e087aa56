"""A worker's share of a pass: what the scheduler asks one worker to train (``RunPass``).

One value on both sides of the control protocol: the operator's driver builds it, its gRPC
client turns it into a ``RunPassRequest``, the worker's control service reads it back, and the
test fakes of a worker take it whole. It lives beside the generated ``worker_pb2`` because the
operator and the worker both import the protocol from here (and neither imports torch for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamtrain_worker.proto import worker_pb2


@dataclass(frozen=True)
class PassShare:
    """Train (or only evaluate, ``train=False``) ``files`` of pass ``pass_index`` of ``day``.

    ``generation`` fences a result of an older scheduler run; ``next_files`` is this worker's
    share of the pass expected next, to read ahead while this one trains (a hint only).
    """

    day: str
    pass_index: int
    files: tuple[str, ...]
    generation: int
    train: bool = True
    next_files: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        day: str,
        pass_index: int,
        files: Sequence[str],
        generation: int,
        train: bool = True,
        next_files: Sequence[str] = (),
    ) -> PassShare:
        """A share from any sequences of paths (stored as tuples, so the value is frozen)."""
        return cls(day, pass_index, tuple(files), generation, train, tuple(next_files))

    def to_request(self) -> worker_pb2.RunPassRequest:
        """The ``worker_pb2.RunPassRequest`` carrying this share."""
        return worker_pb2.RunPassRequest(
            day=self.day,
            pass_index=self.pass_index,
            files=list(self.files),
            generation=self.generation,
            train=self.train,
            next_files=list(self.next_files),
        )

    @classmethod
    def from_request(cls, request: worker_pb2.RunPassRequest) -> PassShare:
        """The share a ``RunPassRequest`` carries."""
        return cls.of(
            request.day,
            int(request.pass_index),
            request.files,
            int(request.generation),
            bool(request.train),
            request.next_files,
        )
