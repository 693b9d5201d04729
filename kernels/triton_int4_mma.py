"""The wide int4 GEMV's K-loop step on the tensor cores at one row (FLOTILLA_INT4_WIDE_MMA): `mma_step`, `mma_rows`.

Why: the FMA step (`triton_int4_gemv_wide._row_step`) costs a `lop3` and an FFMA a weight plus half a shift, ~3.5
sm_90 instructions a weight with the activation work (449 a 16 x 128-word step under Triton 3.6): at 132 SMs x
1.98 GHz that caps the one-row GEMV near ~2.9 TB/s of int4 bytes while the H200 streams 4.3. Here a `lop3` makes two
weights at once, as the two bf16 halves of a register (`(w >> 4i) & 0x000F000F | 0x43004300` = `128 + c` for
nibbles i and i + 4, exact), and one `mma.sync.m16n8k16` multiplies 8 of a thread's weights by its activations: per
16 weights of two rows about 6 shifts, 8 `lop3`, 4 MMAs and 2 byte permutes (~1.25 a weight).

How one MMA serves a GEMV (no shared memory, no layout change): a lane `(g, c)` (`g` = lane / 4, `c` = lane % 4)
gives A's rows g and g + 8 at its four k slots and B's column g at the same k slots. With A's row g = this lane's
first weight row, row g + 8 = its second (the same inputs), B = this lane's activations, D's diagonal `D[g][g]`
is the sum over the four lanes `(g, 0..3)` of each one's own products, `D[g + 8][g]` the same for the second row;
the other entries are cross products, never read. Lanes 4g..4g+3 hold four consecutive 16-byte chunks of the same
row (`layout=1`: a warp's threads along the row), 128 inputs of one group when the group is a multiple of 128, so
the group's scale applies to the MMA's chunk sum (one FMA per fragment register and chunk). The zero point comes
off by a second MMA pair with A = `-(128 + z)` (bf16, exact), so nothing is subtracted per weight; products are
exact (bf16 x small integers) and sums fp32, as the FMA step's.

The diagonal is read after the loop (`mma_rows`): lane (g, c) holds `D[g][2c]`, `D[g][2c + 1]`, `D[g + 8][2c]`,
`D[g + 8][2c + 1]`, so lanes with g = 2c or 2c + 1 hold one diagonal entry of each row.
Under the interpreter (no PTX) the same functions compute each lane's own chunk sum in plain Triton (register 0:
the first row's, register 2: the second's), so the rows' totals are the same sums in another order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flotilla.kernels.triton_int4_gemv import _load

_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def _step_asm() -> str:
    """PTX of one chunk (4 words) of two weight rows: operands `$0..$3` the new fragment (f32), `$4..$7` / `$8..$11`
    the rows' words, `$12..$19` the chunk's activations as 8-byte units (2 a word), `$20`/`$21` the rows' scales,
    `$22`/`$23` the rows' `-(128 + z)` as bf16 pairs, `$24..$27` the fragment before."""
    lines = [".reg .b32 t<4>, pa<4>, pb<4>, xl, xh, yl, yh, x04, x15, x26, x37;",
             ".reg .f32 w<4>, k<4>, zr;", "mov.f32 zr, 0f00000000;"]
    for j in range(4):
        for word, out in ((f"${4 + j}", "pa"), (f"${8 + j}", "pb")):
            for i in range(4):
                src = word
                if i:
                    lines.append(f"shr.u32 t{i}, {word}, {4 * i};")
                    src = f"t{i}"
                lines.append(f"lop3.b32 {out}{i}, {src}, 0x000F000F, 0x43004300, 0xEA;")
        lines += [f"mov.b64 {{xl, xh}}, ${12 + 2 * j};", f"mov.b64 {{yl, yh}}, ${13 + 2 * j};",
                  "prmt.b32 x04, xl, yl, 0x5410;", "prmt.b32 x15, xl, yl, 0x7632;",
                  "prmt.b32 x26, xh, yh, 0x5410;", "prmt.b32 x37, xh, yh, 0x7632;"]
        first = j == 0
        for lo, hi, xa, xb in ((0, 1, "x04", "x15"), (2, 3, "x26", "x37")):
            cw = "{zr, zr, zr, zr}" if first and lo == 0 else "{w0, w1, w2, w3}"
            ck = "{zr, zr, zr, zr}" if first and lo == 0 else "{k0, k1, k2, k3}"
            lines.append(f"{_MMA} {{w0, w1, w2, w3}}, {{pa{lo}, pb{lo}, pa{hi}, pb{hi}}}, {{{xa}, {xb}}}, {cw};")
            lines.append(f"{_MMA} {{k0, k1, k2, k3}}, {{$22, $23, $22, $23}}, {{{xa}, {xb}}}, {ck};")
    for r in range(4):
        lines += [f"add.f32 w{r}, w{r}, k{r};", f"fma.rn.f32 ${r}, w{r}, ${20 + r // 2}, ${24 + r};"]
    return "{\n" + "\n".join(lines) + "\n}"


STEP_ASM = tl.constexpr(_step_asm())
# outputs: the fragment; inputs: 8 words, 8 activation units, 2 scales, 2 zero-point pairs, the fragment before
STEP_CONSTRAINTS = tl.constexpr("=f,=f,=f,=f," + ",".join(["r"] * 8 + ["l"] * 8 + ["f"] * 2 + ["r"] * 2 + ["f"] * 4))
# Lane (g, c)'s diagonal entries: D[g][g] is register 0 where g = 2c, register 1 where g = 2c + 1 (the first row),
# D[g + 8][g] registers 2 / 3 (the second); every other lane gives 0.
DIAGONAL_ASM = tl.constexpr("""{
.reg .b32 l, g, c2;
.reg .pred p0, p1;
mov.u32 l, %laneid;
shr.u32 g, l, 2;
and.b32 c2, l, 3;
shl.b32 c2, c2, 1;
setp.eq.u32 p0, g, c2;
add.u32 c2, c2, 1;
setp.eq.u32 p1, g, c2;
selp.f32 $0, $3, 0f00000000, p1;
selp.f32 $1, $5, 0f00000000, p1;
@p0 mov.f32 $0, $2;
@p0 mov.f32 $1, $4;
}""")


def mma_takes(rows: int, x_kind: int, group_size: int, block_n: int, block_w: int, layout: int) -> bool:
    """Whether a launch can take the MMA step: one bf16 row, `layout=1`, whole groups of 128 (or a multiple) under
    every four lanes (`block_w` a multiple of 16 words), an even row tile (two rows a fragment)."""
    return (rows == 1 and x_kind == 0 and layout == 1 and group_size % 128 == 0 and block_w % 16 == 0
            and block_n >= 2 and block_n % 2 == 0)


@triton.jit
def halves(v):
    """The first and second half of a `[2 H]` vector (the MMA step's two row sets)."""
    H: tl.constexpr = v.shape[0] // 2
    return tl.split(tl.permute(tl.reshape(v, [2, H]), (1, 0)))


@triton.jit
def _neg_bias(zf, HAS_ZEROS: tl.constexpr):
    """`-(128 + z)` as a bf16 pair (an int32) from `z / 16` (fp32 `[H, C]`): exact, 128..143 fit bf16."""
    if HAS_ZEROS:
        b = (-(128.0 + zf * 16.0)).to(tl.int32, bitcast=True)
        return (b & -65536) | ((b >> 16) & 0xFFFF)
    return tl.full(zf.shape, -1022835960, tl.int32)  # 0xC308C308: -(128 + 8), the middle code


@triton.jit
def _chunk_words(words):
    """A `[H, 4 C]` word tile as its chunks' words 0..3, each `[H, C]` (in-thread: a chunk is one thread's 16 bytes)."""
    H: tl.constexpr = words.shape[0]
    C: tl.constexpr = words.shape[1] // 4
    wa, wb = tl.split(tl.reshape(words, [H, C, 2, 2]))
    w0, w2 = tl.split(wa)
    w1, w3 = tl.split(wb)
    return w0, w1, w2, w3


@triton.jit
def _emulated_word(w, u0, u1, zc):
    """`sum_i x_i (c_i - z)` of one word against its activations (two 8-byte units of 4 bf16), in fp32 (plain
    Triton: the interpreter's stand-in for the PTX)."""
    total = tl.zeros(w.shape, tl.float32)
    for i in tl.static_range(8):
        unit = u0 if i < 4 else u1
        half = ((unit >> (16 * (i % 4))) & 0xFFFF).to(tl.int32)
        x = (half << 16).to(tl.float32, bitcast=True)
        c = ((w >> (4 * i)) & 15).to(tl.float32)
        total += x * (c - zc)
    return total


@triton.jit
def mma_step(f0, f1, f2, f3, words_a, words_b, s_a, s_b, zf_a, zf_b, x_ptr, chunk, chunk_ok,
             HAS_ZEROS: tl.constexpr, USE_ASM: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """One step of two row sets (`words_a`, `words_b` `[H, 4 C]`; scales and `z / 16` `[H, C]`) against the bf16
    activations (`x_ptr` int64 units; `chunk [C]` each chunk's first word): the fragments `f0..f3 [H, C]` plus each
    chunk's MMA sums times its scale (PTX), or under the interpreter `f0` / `f2` plus each lane's own chunk sums."""
    a0, a1, a2, a3 = _chunk_words(words_a)
    b0, b1, b2, b3 = _chunk_words(words_b)
    x8 = x_ptr + chunk * 2  # a word's 8 bf16 are 2 units
    u0 = _load(x8, chunk_ok, 0, EVEN)
    u1 = _load(x8 + 1, chunk_ok, 0, EVEN)
    u2 = _load(x8 + 2, chunk_ok, 0, EVEN)
    u3 = _load(x8 + 3, chunk_ok, 0, EVEN)
    u4 = _load(x8 + 4, chunk_ok, 0, EVEN)
    u5 = _load(x8 + 5, chunk_ok, 0, EVEN)
    u6 = _load(x8 + 6, chunk_ok, 0, EVEN)
    u7 = _load(x8 + 7, chunk_ok, 0, EVEN)
    if USE_ASM:
        f0, f1, f2, f3 = tl.inline_asm_elementwise(
            asm=STEP_ASM,
            constraints=STEP_CONSTRAINTS,
            args=[a0, a1, a2, a3, b0, b1, b2, b3, u0, u1, u2, u3, u4, u5, u6, u7, s_a, s_b,
                  _neg_bias(zf_a, HAS_ZEROS), _neg_bias(zf_b, HAS_ZEROS), f0, f1, f2, f3],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )  # fmt: skip
    else:
        if HAS_ZEROS:
            za = zf_a * 16.0
            zb = zf_b * 16.0
        else:
            za = tl.full(s_a.shape, 8.0, tl.float32)
            zb = za
        sum_a = (_emulated_word(a0, u0, u1, za) + _emulated_word(a1, u2, u3, za) + _emulated_word(a2, u4, u5, za)
                 + _emulated_word(a3, u6, u7, za))  # fmt: skip
        sum_b = (_emulated_word(b0, u0, u1, zb) + _emulated_word(b1, u2, u3, zb) + _emulated_word(b2, u4, u5, zb)
                 + _emulated_word(b3, u6, u7, zb))  # fmt: skip
        f0 += s_a * sum_a
        f2 += s_b * sum_b
    return f0, f1, f2, f3


@triton.jit
def mma_rows(f0, f1, f2, f3, USE_ASM: tl.constexpr):
    """After the loop: each row set's sums over the chunks, `[H]` each (the fragments' diagonal entries, `DIAGONAL_ASM`;
    under the interpreter registers 0 and 2)."""
    if USE_ASM:
        va, vb = tl.inline_asm_elementwise(asm=DIAGONAL_ASM, constraints="=f,=f,f,f,f,f", args=[f0, f1, f2, f3],
                                           dtype=(tl.float32, tl.float32), is_pure=True, pack=1)  # fmt: skip
    else:
        va = f0
        vb = f2
    return tl.sum(va, 1), tl.sum(vb, 1)


__all__ = ["DIAGONAL_ASM", "STEP_ASM", "halves", "mma_rows", "mma_step", "mma_takes"]
