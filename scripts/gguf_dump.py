#!/usr/bin/env python3
"""Prints a GGUF file's metadata and tensor table (a debugging aid; the engine has its own reader)."""
import struct, sys

def main(path, max_array=8):
    f = open(path, 'rb'); d = f.read(); o = 0
    def rd(fmt):
        nonlocal o
        v = struct.unpack_from('<' + fmt, d, o); o += struct.calcsize('<' + fmt); return v[0]
    def rstr():
        nonlocal o
        n = rd('Q'); s = d[o:o + n].decode('utf-8', 'replace'); o += n; return s
    fmts = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    def rval(t):
        if t == 8: return rstr()
        if t == 9:
            et = rd('I'); n = rd('Q'); vals = [rval(et) for _ in range(n)]
            return vals if n <= max_array else f'[{n} x type {et}] {vals[:max_array]}...'
        return rd(fmts[t])
    assert d[:4] == b'GGUF', 'not a GGUF file'; o = 4
    ver = rd('I'); nt = rd('Q'); nkv = rd('Q')
    print(f'version {ver}, {nt} tensors, {nkv} kv')
    for _ in range(nkv):
        k = rstr(); t = rd('I'); print(f'  {k} = {rval(t)!r}'[:300])
    for _ in range(nt):
        name = rstr(); nd = rd('I'); shape = [rd('Q') for _ in range(nd)]; t = rd('I'); off = rd('Q')
        print(f'  tensor {name} {shape} type {t} off {off}')

if __name__ == '__main__':
    main(sys.argv[1])
