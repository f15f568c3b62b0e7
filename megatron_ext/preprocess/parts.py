"""The work folder of a preprocessing job: what makes it resumable and its output atomic.

``{output_prefix}.work/`` holds ``job.json`` (the job's settings and input files) and numbered
*parts*: runs of consecutive documents, each written as one indexed dataset per JSON key (the
bytes megatron.core's ``IndexedDatasetBuilder`` would write), and complete once its manifest
``part-NNNNNN.json`` exists (written last, atomically). The manifest records where in the inputs
the part ends and what it holds. A resumed job keeps the complete parts, deletes anything else,
and continues after the end of the last complete part. Nothing under the final output names
exists until every part is complete and merged.
"""

from __future__ import annotations

import collections
import glob
import os
import shutil

import numpy as np

from ..datasets.indexed import write_index
from ..runtime.errors import DataError
from ..runtime.files import fsync_path, read_json, write_json
from .encode import EncodedBatch

# A part ends after the batch that takes it to this many documents, which bounds the index it
# keeps in memory (12 bytes per sequence, 8 per document), whatever the size of the input.
MAX_PART_DOCUMENTS = 1 << 18


def dataset_prefix(output_prefix: str, key: str) -> str:
    """Megatron-LM's name for the dataset of a JSON key."""
    return f"{output_prefix}_{key}_document"


class PartWriter:
    """Writes one part: a ``.bin`` per JSON key as batches come, the ``.idx`` files at the end,
    and the counts its manifest records."""

    def __init__(self, prefixes: dict[str, str], dtype: type):
        self.prefixes = prefixes
        self.dtype = dtype
        self.bins = {key: open(f"{prefix}.bin", "wb") for key, prefix in prefixes.items()}
        self.sequence_lengths = {key: [] for key in prefixes}  # int32 arrays, one per batch
        self.sequences_per_document = {key: [] for key in prefixes}  # int64 arrays
        self.documents = 0
        self.tokens = dict.fromkeys(prefixes, 0)
        self.max_token_id = -1
        self.bad_lines = collections.Counter()
        self.reference_documents = self.verified_documents = 0

    def is_full(self, max_tokens: int) -> bool:
        return self.documents >= MAX_PART_DOCUMENTS or sum(self.tokens.values()) >= max_tokens

    def write(self, batch: EncodedBatch) -> None:
        for key, encoded in batch.keys.items():
            if len(encoded.tokens):
                largest = encoded.max_token_id if encoded.max_token_id is not None \
                    else int(encoded.tokens.max())
                if largest > np.iinfo(self.dtype).max:
                    raise DataError(f"token id {largest} does not fit the output dtype "
                                    f"{np.dtype(self.dtype).name} chosen from the vocabulary "
                                    "size")
                self.max_token_id = max(self.max_token_id, largest)
            self.bins[key].write(encoded.tokens.astype(self.dtype, copy=False).tobytes())
            self.sequence_lengths[key].append(encoded.sequence_lengths.astype(np.int32))
            self.sequences_per_document[key].append(encoded.sequences_per_document)
            self.tokens[key] += len(encoded.tokens)
        self.documents += batch.documents
        self.reference_documents += batch.reference_documents
        self.verified_documents += batch.verified
        self.bad_lines.update(kind for _, kind, _ in batch.bad)

    def finish(self) -> None:
        for key, prefix in self.prefixes.items():
            self.bins[key].close()
            per_document = np.concatenate([np.zeros(1, np.int64),
                                           *self.sequences_per_document[key]])
            lengths = np.concatenate([np.zeros(0, np.int32), *self.sequence_lengths[key]])
            write_index(f"{prefix}.idx", self.dtype, [(lengths, np.cumsum(per_document))])
            fsync_path(f"{prefix}.bin")
            fsync_path(f"{prefix}.idx")

    def close(self) -> None:
        """Close the files of a part that will not be finished (the run stops)."""
        for f in self.bins.values():
            f.close()


class WorkDir:
    """``{output_prefix}.work/``: the job record, the parts, the merged datasets before renaming."""

    def __init__(self, output_prefix: str):
        self.path = f"{output_prefix}.work"
        self.job_path = os.path.join(self.path, "job.json")

    def part_prefix(self, index: int, key: str) -> str:
        return dataset_prefix(os.path.join(self.path, f"part-{index:06d}"), key)

    def merged_prefix(self, key: str) -> str:
        return dataset_prefix(os.path.join(self.path, "merged"), key)

    def _manifest_path(self, index: int) -> str:
        return os.path.join(self.path, f"part-{index:06d}.json")

    def start(self, settings: dict, inputs: list[list], resume: bool) -> list[dict]:
        """Create the folder, or reopen it with ``resume``: the manifests of the complete parts.

        ``inputs`` lists ``[path, fingerprint]``; inputs that complete parts read must be
        unchanged, and so must ``settings``."""
        if os.path.isdir(self.path) and not os.path.exists(self._manifest_path(0)):
            shutil.rmtree(self.path)  # an interrupted run that completed nothing
        if not os.path.isdir(self.path):
            os.makedirs(self.path)
            write_json(self.job_path, {"settings": settings, "inputs": inputs})
            return []
        if not resume:
            raise DataError(f"{self.path} holds complete parts of an interrupted run: "
                            "pass --resume to continue it, or delete it to start over")
        job = read_json(self.job_path)
        changed = sorted(k for k in settings.keys() | job["settings"].keys()
                         if settings.get(k) != job["settings"].get(k))
        if changed:
            raise DataError(f"--resume: {', '.join(changed)} differ from the interrupted "
                            f"run in {self.path}; rerun with the same settings, or delete it to "
                            "start over")
        if [path for path, _ in inputs] != [path for path, _ in job["inputs"]]:
            raise DataError(f"--resume: the input files differ from those of the "
                            f"interrupted run in {self.path}; rerun with the same --input, or "
                            "delete it to start over")
        manifests = []
        while os.path.exists(self._manifest_path(len(manifests))):
            manifests.append(read_json(self._manifest_path(len(manifests))))
        read = len(inputs) if manifests[-1]["final"] else manifests[-1]["end_input"] + 1
        for (path, fingerprint), (_, old) in zip(inputs[:read], job["inputs"]):
            if fingerprint != old:
                raise DataError(f"--resume: {path} changed since the interrupted run "
                                f"read it; delete {self.path} to start over")
        self._remove_parts_from(len(manifests))
        write_json(self.job_path, {"settings": settings, "inputs": inputs})
        return manifests

    def _remove_parts_from(self, index: int) -> None:
        for path in glob.glob(os.path.join(self.path, "part-*")):
            part = int(os.path.basename(path)[len("part-"):][:6])
            if part >= index:
                os.remove(path)
        for path in glob.glob(os.path.join(self.path, "merged_*")):
            os.remove(path)

    def new_part(self, index: int, keys: list[str], dtype: type) -> PartWriter:
        return PartWriter({key: self.part_prefix(index, key) for key in keys}, dtype)

    def complete_part(self, index: int, part: PartWriter, end_input: int, end_line: int,
                      final: bool) -> dict:
        """Finalize ``part`` and write its manifest, which marks it complete."""
        part.finish()
        manifest = {"part": index, "end_input": end_input, "end_line": end_line, "final": final,
                    "documents": part.documents, "tokens": part.tokens,
                    "max_token_id": part.max_token_id, "bad_lines": dict(part.bad_lines),
                    "reference_documents": part.reference_documents,
                    "verified_documents": part.verified_documents}
        write_json(self._manifest_path(index), manifest)
        return manifest

    def remove(self) -> None:
        shutil.rmtree(self.path)
