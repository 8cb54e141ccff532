"""Documents a conversation answers from: their text (plain text, Markdown, source code, a PDF's
text layer through pypdf) and what of it goes into the prompt.

When the documents fit the context beside the chat, the whole text goes in. Otherwise they are cut
into chunks of a few paragraphs, the chunks are ranked against the question with BM25 (bm25s: no
embedding model to download, and a question that names a fact finds the chunk that holds it), and
the best that fit are put in, in their documents' order. Either way the answer cites what it was
given (the `cited` list, kept with the answer's statistics)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PDF = {".pdf"}
TEXT = {".txt", ".md", ".markdown", ".rst", ".org", ".csv", ".tsv", ".log", ".tex"}
SOURCE = {
    ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".cxx", ".cs", ".java", ".kt", ".scala",
    ".go", ".rs", ".swift", ".m", ".js", ".mjs", ".ts", ".tsx", ".jsx", ".rb", ".php", ".pl",
    ".lua", ".r", ".jl", ".sh", ".bash", ".zsh", ".ps1", ".sql", ".html", ".htm", ".css", ".scss",
    ".xml", ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".cmake", ".mk", ".dart", ".hs",
    ".ex", ".exs", ".erl", ".clj", ".vue", ".svelte", ".zig", ".nim", ".f90", ".proto",
}  # fmt: skip
NAMED = {"makefile", "dockerfile", "cmakelists.txt", "readme", "license"}  # files without a suffix
MAX_BYTES = 20 * 1024 * 1024  # a bigger file is almost certainly not a document to chat with
CHUNK_CHARS = 900  # ~200 tokens: a few paragraphs, enough to hold a fact with its context
MARGIN_TOKENS = 16  # the headers' and separators' tokens, counted loosely


class DocumentError(ValueError):
    """A file that cannot be attached (the reason is the message)."""


def attachable(path: Path) -> bool:
    """Whether a file's name says it is a document we read (a PDF, text, source code)."""
    suffix = path.suffix.lower()
    return suffix in PDF | TEXT | SOURCE or path.name.lower() in NAMED


def dropped(mime) -> tuple[str | None, list[str]]:
    """What was dropped on the window (a QMimeData): the first local path that may be a model (a
    .gguf file or a folder; None if none), and the local files that are documents."""
    if not mime.hasUrls():
        return None, []
    paths = [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile()]
    model = next((p for p in paths if p.is_dir() or p.suffix.lower() == ".gguf"), None)
    documents = [str(p) for p in paths if p.is_file() and attachable(p)]
    return (str(model) if model is not None else None), documents


def read_document(path: str | Path) -> str:
    """The text of a document. Raises DocumentError with the reason it has none we can use."""
    path = Path(path)
    if not path.is_file():
        raise DocumentError(f"{path} is not a file")
    if path.stat().st_size > MAX_BYTES:
        raise DocumentError(f"{path.name} is larger than {MAX_BYTES // 2**20} MB")
    if path.suffix.lower() in PDF:
        text = _pdf_text(path)
    else:
        raw = path.read_bytes()
        if b"\0" in raw[:8192]:
            raise DocumentError(f"{path.name} is a binary file, not text")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")  # old text files: every byte is a character
    text = text.replace("\r\n", "\n").strip()
    if not text:
        raise DocumentError(f"{path.name} has no text")
    return text


def _pdf_text(path: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{path.name} is encrypted with a password")
        pages = [page.extract_text() or "" for page in reader.pages]
    except PdfReadError as e:
        raise DocumentError(f"{path.name} is not a readable PDF: {e}") from e
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise DocumentError(f"{path.name} has no text layer (a scan? it would need OCR)")
    return text


def chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """text cut into chunks of about `size` characters at paragraph breaks (a longer paragraph at
    its sentences, a longer sentence where it must)."""
    pieces: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        while len(para) > size:
            cut = max(para.rfind(". ", 0, size), para.rfind("\n", 0, size))
            cut = cut + 1 if cut > size // 3 else size
            pieces.append(para[:cut].strip())
            para = para[cut:].strip()
        if para:
            pieces.append(para)
    out: list[str] = []
    for piece in pieces:  # paragraphs gathered up to the size
        if out and len(out[-1]) + 2 + len(piece) <= size:
            out[-1] += "\n\n" + piece
        else:
            out.append(piece)
    return out


@dataclass
class DocumentContext:
    text: str  # what goes before the question ("" without documents)
    cited: list[dict]  # what of the documents it holds: {name, tokens, part, parts, excerpt}


def build_context(
    documents: list[dict], question: str, budget: int, count: Callable[[str], int]
) -> DocumentContext:
    """What of `documents` ({name, text} dicts) to put before `question`, in at most `budget`
    tokens as `count` counts them: every document whole when they all fit, else the chunks BM25
    ranks best against the question (see rank), as many as fit. A whole document is cited with
    part 0."""
    if not documents:
        return DocumentContext("", [])
    whole = [(d["name"], d["text"], count(d["text"])) for d in documents]
    if sum(t for *_, t in whole) + MARGIN_TOKENS * len(whole) <= budget:
        cited = [
            {"name": n, "tokens": t, "part": 0, "parts": 1, "excerpt": ""} for n, _, t in whole
        ]
        return DocumentContext(_format([(n, "", text) for n, text, _ in whole]), cited)
    parts = [
        (d["name"], i + 1, len(pieces), piece)
        for d in documents
        for pieces in [chunks(d["text"])]
        for i, piece in enumerate(pieces)
    ]
    chosen, room = [], budget
    for k in rank(question, [p[3] for p in parts]):
        tokens = count(parts[k][3]) + MARGIN_TOKENS
        if tokens <= room:
            chosen.append((k, tokens))
            room -= tokens
    chosen.sort()  # in the documents' order: a chunk reads on from the one before it
    cited = [
        {"name": parts[k][0], "tokens": t - MARGIN_TOKENS, "part": parts[k][1],
         "parts": parts[k][2], "excerpt": _excerpt(parts[k][3])}
        for k, t in chosen
    ]  # fmt: skip
    labelled = [
        (parts[k][0], f"part {parts[k][1]} of {parts[k][2]}", parts[k][3]) for k, _ in chosen
    ]
    return DocumentContext(_format(labelled), cited)


def scores(question: str, texts: list[str]) -> list[float]:
    """BM25 scores of texts against question, over English word stems (Snowball's, through
    PyStemmer: "keepers" finds "keeper") without stopwords; 0 for a text sharing no word with it
    (all 0 when the question is stopwords only)."""
    import bm25s
    import Stemmer

    words = dict(stopwords="en", stemmer=Stemmer.Stemmer("english"), show_progress=False)
    corpus = bm25s.tokenize(texts, **words)
    (query,) = bm25s.tokenize([question], return_ids=False, **words)
    if not query or not corpus.vocab:
        return [0.0] * len(texts)
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)
    return [float(x) for x in index.get_scores(query)]


def rank(question: str, texts: list[str]) -> list[int]:
    """The indices of the texts that share a word with question, the best match first; when none
    does (a question such as "summarise this"), all of them in their order: the beginning of a
    document is the best guess at what it is about. A part that matches nothing would only take
    room and lead a small model astray."""
    score = scores(question, texts)
    matching = sorted((i for i in range(len(texts)) if score[i] > 0), key=lambda i: (-score[i], i))
    return matching or list(range(len(texts)))


def _excerpt(text: str, words: int = 8) -> str:
    head = text.split()
    return " ".join(head[:words]) + ("…" if len(head) > words else "")


def _format(parts: list[tuple[str, str, str]]) -> str:
    """The documents' block: each (name, which part, text) under a header naming it."""
    return "\n\n".join(
        f"[{name}{', ' + which if which else ''}]\n{text}" for name, which, text in parts
    )


def with_documents(question: str, context: DocumentContext) -> str:
    """The user's turn as the model reads it: the documents first, then the question."""
    if not context.text:
        return question
    return f"Documents:\n\n{context.text}\n\nAnswer using the documents above.\n\n{question}"
