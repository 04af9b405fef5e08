"""Byte-level BPE (GPT-2 style) trained on the corpus, encoded exactly like kvpack's tokenizer.

- Pre-tokenizer: the `qwen2` pattern of llama.cpp / kvpack (src/tokenizer/pretokenize.cpp):
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+
  Every digit is its own pre-token, so numbers are always one token per digit. With `pre="llama-bpe"` the
  pattern is llama 3's (the same but \\p{N}{1,3}: up to three digits per pre-token) and, as llama.cpp / kvpack
  do for that pre-tokenizer, a pre-token that is itself a vocabulary token is emitted whole (ignore_merges).
- Symbols are GPT-2's byte-to-unicode characters; a merge is "left right" in those characters; the vocab is
  the 256 byte tokens (GPT-2 order), then one token per merge (in merge order), then the special tokens.
- Encoding a pre-token merges the adjacent pair of lowest merge rank first (leftmost on ties), which is what
  kvpack's priority-queue implementation does.
- Training is plain BPE on pre-token counts (most frequent pair first, ties broken by the pair's text), with one
  restriction: no merge may produce a token that has an uppercase ASCII letter and no lowercase one. Random
  uppercase names in the tasks (VAR ZXUSA, PRUP -> TBRG) therefore never merge with a leading space or each
  other by accident of the corpus; with `upper_pairs` all 676 two-letter uppercase tokens are appended as
  merges, so such a name is tokenized the same wherever it appears (with or without a leading space) in about
  half as many tokens.
"""
import heapq
import re
import unicodedata
from collections import Counter


def byte_to_unicode():
    """GPT-2's bytes_to_unicode() (same table as kvpack's byte_to_cpt_table)."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def byte_tokens():
    """The 256 byte tokens in GPT-2 vocabulary order (printable bytes first, then the remapped ones)."""
    t = byte_to_unicode()
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    rest = [b for b in range(256) if b not in printable]
    return [t[b] for b in printable] + [t[b] for b in rest]


# ASCII-exact version of the qwen2 pattern (letters [A-Za-z] + non-ASCII letters, single digits).
_L = r"A-Za-z\u00C0-\u024F"  # letters we may meet; non-ASCII text is checked by _pretok_generic
def _pat_ascii(max_digits):
    return re.compile(
        r"'(?i:[stmd]|re|ve|ll)"
        r"|[^\r\n" + _L + r"0-9][" + _L + r"]+|[" + _L + r"]+"
        r"|[0-9]{1," + str(max_digits) + r"}"
        r"| ?[^\s" + _L + r"0-9]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")


_PAT_ASCII = {1: _pat_ascii(1), 3: _pat_ascii(3)}


def _flags(ch):
    """(letter, number, whitespace) by Unicode category, for the generic pre-tokenizer."""
    if ch.isspace():
        return 4
    cat = unicodedata.category(ch)
    if cat[0] == "L":
        return 1
    if cat[0] == "N":
        return 2
    return 0


def _pretok_generic(s, max_digits=1):
    """Port of kvpack's split_llama3(max_digits) for arbitrary Unicode text (slow, exact)."""
    L, N, W = 1, 2, 4
    fl = [_flags(c) for c in s]
    n, pos, out = len(s), 0, []

    def f(k):
        return fl[k] if k < n else 0

    while pos < n:
        c = s[pos]
        end = 0
        if c == "'" and pos + 1 < n:
            c1 = s[pos + 1].lower() if s[pos + 1].isascii() else s[pos + 1]
            if c1 in "stmd":
                end = pos + 2
            elif pos + 2 < n:
                c2 = s[pos + 2].lower() if s[pos + 2].isascii() else s[pos + 2]
                if c1 + c2 in ("re", "ve", "ll"):
                    end = pos + 3
        if end:
            pass
        elif not (c in "\r\n" or fl[pos] & N) and (fl[pos] & L or f(pos + 1) & L):
            end = pos + 1
            while end < n and fl[end] & L:
                end += 1
        elif fl[pos] & N:
            end = pos + 1
            while end < n and end - pos < max_digits and fl[end] & N:
                end += 1
        else:
            q0 = pos + 1 if c == " " else pos
            if q0 < n and not fl[q0] & (W | L | N):
                end = q0
                while end < n and not fl[end] & (W | L | N):
                    end += 1
                while end < n and s[end] in "\r\n":
                    end += 1
            else:
                k, last_nl = pos, 0
                while k < n and fl[k] & W:
                    if s[k] in "\r\n":
                        last_nl = k + 1
                    k += 1
                if last_nl:
                    end = last_nl
                elif k - pos > 1 and k < n:
                    end = k - 1
                elif k > pos:
                    end = k
                else:
                    end = pos + 1
        out.append(s[pos:end])
        pos = end
    return out


def pretokenize(text, max_digits=1):
    """Pre-tokens (str) of `text` with the qwen2 rules (max_digits 1) or llama 3's (max_digits 3)."""
    if text.isascii():
        return _PAT_ASCII[max_digits].findall(text)
    return _pretok_generic(text, max_digits)


def _allowed(tok, no_digits=False):
    if no_digits and any("0" <= ch <= "9" for ch in tok):
        return False  # digit tokens are the appended 2- and 3-digit strings only
    has_upper = any("A" <= ch <= "Z" for ch in tok)
    has_lower = any("a" <= ch <= "z" for ch in tok)
    return not (has_upper and not has_lower)


class BPE:
    PRE = {"qwen2": (1, False), "llama-bpe": (3, True)}  # name -> (digits per pre-token, ignore_merges)

    def __init__(self, merges, specials=("<|endoftext|>",), pre="qwen2"):
        self.pre = pre
        self.max_digits, self.ignore_merges = self.PRE[pre]
        self.b2u = byte_to_unicode()
        self.merges = list(merges)  # [(left, right)] in rank order
        self.rank = {m: i for i, m in enumerate(self.merges)}
        tokens = byte_tokens()
        for a, b in self.merges:
            tokens.append(a + b)
        self.n_normal = len(tokens)
        tokens += list(specials)
        self.tokens = tokens
        self.tok2id = {}
        for i, t in enumerate(tokens):
            self.tok2id.setdefault(t, i)  # duplicates: first id wins (as kvpack)
        self.specials = list(specials)
        self.bos = self.tok2id[specials[0]]
        self.eos = self.bos
        self._cache = {}
        # decoding: token id -> bytes
        u2b = {v: k for k, v in self.b2u.items()}
        self.tok_bytes = []
        for i, t in enumerate(tokens):
            if i >= self.n_normal:
                self.tok_bytes.append(b"")
            else:
                self.tok_bytes.append(bytes(u2b[ch] for ch in t))

    @property
    def n_vocab(self):
        return len(self.tokens)

    def _bpe_word(self, word):
        syms = list(word)
        rank = self.rank
        while len(syms) > 1:
            best, bi = None, -1
            for i in range(len(syms) - 1):
                r = rank.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            syms[bi:bi + 2] = [syms[bi] + syms[bi + 1]]
        return [self.tok2id[s] for s in syms]

    def encode(self, text, bos=False):
        out = [self.bos] if bos else []
        cache, b2u = self._cache, self.b2u
        for p in pretokenize(text, self.max_digits):
            ids = cache.get(p)
            if ids is None:
                word = "".join(b2u[b] for b in p.encode("utf-8"))
                whole = self.tok2id.get(word) if self.ignore_merges else None
                ids = [whole] if whole is not None and whole < self.n_normal else self._bpe_word(word)
                if len(cache) < 500000:
                    cache[p] = ids
            out.extend(ids)
        return out

    def decode(self, ids):
        return b"".join(self.tok_bytes[i] for i in ids if 0 <= i < len(self.tok_bytes)).decode("utf-8", "replace")

    def to_dict(self):
        return {"merges": [list(m) for m in self.merges], "specials": self.specials, "pre": self.pre}

    @classmethod
    def from_dict(cls, d):
        return cls([tuple(m) for m in d["merges"]], tuple(d["specials"]), d.get("pre", "qwen2"))


def train_bpe(texts, n_vocab, upper_pairs=True, specials=("<|endoftext|>",), log=print, pre="qwen2",
              digit_tokens=False):
    """Learns merges until the vocab (bytes + merges + specials) has n_vocab tokens.
    texts: strings, or (string, weight) pairs (the pre-token counts of a text are multiplied by its weight).
    digit_tokens (with pre="llama-bpe"): no learned merge contains a digit; every digit string of 2 .. digit_tokens
    (2 or 3; True = 3) digits is appended as a token instead (ranked last). 3: any number is ceil(len / 3) tokens
    from 1110 near-unique ones; 2: ~len / 2 tokens from only 110, which the model copies more precisely."""
    digit_tokens = 3 if digit_tokens is True else int(digit_tokens or 0)
    if digit_tokens not in (0, 2, 3):
        raise ValueError("digit_tokens is 0, 2 or 3")
    if digit_tokens and BPE.PRE[pre][0] < 3:
        raise ValueError("digit_tokens needs a pre-tokenizer that groups digits (llama-bpe)")
    max_digits = BPE.PRE[pre][0]
    b2u = byte_to_unicode()
    counts = Counter()
    for t in texts:
        t, wt = t if isinstance(t, tuple) else (t, 1)
        c = Counter(pretokenize(t, max_digits))
        if wt != 1:
            c = Counter({k: v * wt for k, v in c.items()})
        counts.update(c)
    words, freqs = [], []
    for w, c in counts.items():
        words.append(["".join(b2u[b] for b in ch.encode("utf-8")) for ch in w])
        freqs.append(c)
    # (split per byte: each byte is one mapped character)
    words = [[ch for sym in w for ch in sym] for w in words]
    n_extra = (26 * 26 if upper_pairs else 0) + {0: 0, 2: 100, 3: 1100}[digit_tokens]
    n_learn = n_vocab - 256 - len(specials) - n_extra
    if n_learn < 0:
        raise ValueError("n_vocab too small")

    pair_count = Counter()
    where = {}
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for i in range(len(w) - 1):
            p = (w[i], w[i + 1])
            pair_count[p] += f
            where.setdefault(p, set()).add(wi)
    heap = [(-c, p) for p, c in pair_count.items() if _allowed(p[0] + p[1], digit_tokens)]
    heapq.heapify(heap)
    merges, have = [], set(byte_tokens())
    n_tokens_added = 0
    while n_tokens_added < n_learn and heap:
        negc, p = heapq.heappop(heap)
        if pair_count.get(p, 0) != -negc:
            continue  # stale
        if -negc < 2:
            break
        merges.append(p)
        new = p[0] + p[1]
        if new not in have:
            have.add(new)
            n_tokens_added += 1
        changed = Counter()
        for wi in where.pop(p, ()):
            w, f = words[wi], freqs[wi]
            if len(w) < 2:
                continue
            # remove old pairs
            for i in range(len(w) - 1):
                q = (w[i], w[i + 1])
                pair_count[q] -= f
                changed[q] += 1
            nw, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == p[0] and w[i + 1] == p[1]:
                    nw.append(new)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            words[wi] = nw
            for i in range(len(nw) - 1):
                q = (nw[i], nw[i + 1])
                pair_count[q] += f
                changed[q] += 1
                where.setdefault(q, set()).add(wi)
        pair_count.pop(p, None)
        for q in changed:
            c = pair_count.get(q, 0)
            if c <= 0:
                pair_count.pop(q, None)
            elif q != p and _allowed(q[0] + q[1], digit_tokens):
                heapq.heappush(heap, (-c, q))
    if upper_pairs:
        for a in range(26):
            for b in range(26):
                merges.append((chr(65 + a), chr(65 + b)))
    if digit_tokens:
        digits = "0123456789"
        merges += [(a, b) for a in digits for b in digits]
        if digit_tokens == 3:
            merges += [(a + b, c) for a in digits for b in digits for c in digits]
    bpe = BPE(merges, specials, pre)
    log(f"bpe: {len(merges)} merges, vocab {bpe.n_vocab}")
    return bpe
