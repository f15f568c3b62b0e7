"""The work folder of a preprocessing job: what makes it resumable and its output atomic.

``{output_prefix}.work/`` holds ``job.json`` (the job's settings and input files), the workers'
token files (``worker-PID_KEY.bin``: each worker appends the tokens of its tasks to its own) and
numbered *parts*: runs of consecutive documents, each an index per JSON key
(``part-NNNNNN_KEY_document.idx``, the bytes megatron.core's ``IndexedDatasetBuilder`` writes)
whose tokens are *segments* of the token files, and complete once its manifest
``part-NNNNNN.json`` exists (written last, atomically, after the segments and the index are on
disk). The manifest records where in the inputs the part ends, its segments and what it holds.
A resumed job keeps the complete parts, deletes anything else (token files no complete part
names, the tails of those it names), and continues after the end of the last complete part.
Nothing under the final output names exists until every part is complete and merged.
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
from typing import Optional

import numpy as np

from ..datasets.indexed import write_index
from ..runtime.errors import DataError
from ..runtime.files import fsync_path, read_json, write_json
from .encode import TaskResult

# A part ends after the task that takes it to this many documents, which bounds the index it
# keeps in memory (12 bytes per sequence, 8 per document), whatever the size of the input.
MAX_PART_DOCUMENTS = 1 << 18


def dataset_prefix(output_prefix: str, key: str) -> str:
    """Megatron-LM's name for the dataset of a JSON key."""
    return f"{output_prefix}_{key}_document"


class PartIndex:
    """One part as the tasks' answers come: each key's document index, the segments of the
    token files that hold its tokens (``[file, offset, bytes]``, in order), and the counts its
    manifest records."""

    def __init__(self, keys: list[str], dtype: type):
        self.keys, self.dtype = keys, dtype
        self.sequence_lengths = {key: [] for key in keys}  # int32 arrays, one per task
        self.sequences_per_document = {key: [] for key in keys}  # int64 arrays
        self.segments = {key: [] for key in keys}
        self.documents = 0
        self.tokens = dict.fromkeys(keys, 0)
        self.max_token_id = -1
        self.bad_lines = collections.Counter()
        self.reference_documents = self.verified_documents = 0

    def is_full(self, max_tokens: int) -> bool:
        return self.documents >= MAX_PART_DOCUMENTS or sum(self.tokens.values()) >= max_tokens

    def add(self, result: TaskResult) -> None:
        for key, written in result.keys.items():
            if written.max_token_id > np.iinfo(self.dtype).max:
                raise DataError(f"token id {written.max_token_id} does not fit the output "
                                f"dtype {np.dtype(self.dtype).name} chosen from the vocabulary "
                                "size")
            self.max_token_id = max(self.max_token_id, written.max_token_id)
            segments = self.segments[key]
            if written.nbytes:
                if segments and segments[-1][0] == written.file \
                        and sum(segments[-1][1:]) == written.offset:
                    segments[-1][2] += written.nbytes
                else:
                    segments.append([written.file, written.offset, written.nbytes])
            self.sequence_lengths[key].append(written.sequence_lengths)
            self.sequences_per_document[key].append(written.sequences_per_document)
            self.tokens[key] += written.tokens
        self.documents += result.documents
        self.reference_documents += result.reference_documents
        self.verified_documents += result.verified
        self.bad_lines.update(kind for _, _, kind, _ in result.bad)

    def finish(self, prefixes: dict[str, str], folder: str) -> None:
        """Write the index of each key (at ``prefixes``) and put it and the segments' token
        files (in ``folder``) on disk."""
        for key, prefix in prefixes.items():
            per_document = np.concatenate([np.zeros(1, np.int64),
                                           *self.sequences_per_document[key]])
            lengths = np.concatenate([np.zeros(0, np.int32), *self.sequence_lengths[key]])
            write_index(f"{prefix}.idx", self.dtype, [(lengths, np.cumsum(per_document))])
            fsync_path(f"{prefix}.idx")
        for name in sorted({segment[0] for key in self.keys for segment in self.segments[key]}):
            fsync_path(os.path.join(folder, name))


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
        self._trim_token_files(manifests, settings["--json-keys"])
        write_json(self.job_path, {"settings": settings, "inputs": inputs})
        return manifests

    def _remove_parts_from(self, index: int) -> None:
        for path in glob.glob(os.path.join(self.path, "part-*")):
            part = int(os.path.basename(path)[len("part-"):][:6])
            if part >= index:
                os.remove(path)
        for path in glob.glob(os.path.join(self.path, "merged_*")):
            os.remove(path)

    def _trim_token_files(self, manifests: list[dict], keys: list[str]) -> None:
        """Delete the token files no complete part names; cut those it names after the last
        byte they hold (what an interrupted task appended after)."""
        ends = {}
        for manifest in manifests:
            for key in keys:
                for name, offset, nbytes in self.segments(manifest, key):
                    ends[name] = max(ends.get(name, 0), offset + nbytes)
        for path in glob.glob(os.path.join(self.path, "worker-*")):
            name = os.path.basename(path)
            if name not in ends:
                os.remove(path)
            elif os.path.getsize(path) > ends[name]:
                os.truncate(path, ends[name])

    def segments(self, manifest: dict, key: str) -> list[list]:
        """``[file, offset, bytes]`` of the tokens of a part's ``key``, in order (a part written
        before the token files holds them in its own ``.bin``)."""
        if "segments" in manifest:
            return manifest["segments"][key]
        name = os.path.basename(self.part_prefix(manifest["part"], key)) + ".bin"
        return [[name, 0, os.path.getsize(os.path.join(self.path, name))]]

    def new_part(self, keys: list[str], dtype: type) -> PartIndex:
        return PartIndex(keys, dtype)

    def complete_part(self, index: int, part: PartIndex, end_input: int, end_line: int,
                      end_offset: Optional[int], final: bool) -> dict:
        """Finalize ``part`` and write its manifest, which marks it complete."""
        part.finish({key: self.part_prefix(index, key) for key in part.keys}, self.path)
        manifest = {"part": index, "end_input": end_input, "end_line": end_line,
                    "end_offset": end_offset, "final": final, "documents": part.documents,
                    "tokens": part.tokens, "max_token_id": part.max_token_id,
                    "bad_lines": dict(part.bad_lines), "segments": part.segments,
                    "reference_documents": part.reference_documents,
                    "verified_documents": part.verified_documents}
        write_json(self._manifest_path(index), manifest)
        return manifest

    def remove(self) -> None:
        shutil.rmtree(self.path)
