/*
 * XXH3, the checksum of kvtier's chunk headers and payloads, written from its specification
 * (doc/xxhash_spec.md of the xxHash project) and tested against the `xxhash` Python package's
 * output (tests/tiers/shared/test_xxh3.py): the 128-bit hash of any input, the 64-bit hash of
 * 17-128 bytes (the header checksum), both with the default secret and seed 0.
 *
 * Why it is compiled here rather than called through the `xxhash` package: the fs tier hashes a
 * chunk right after its read or before its write, inside the same call that released the GIL
 * for the I/O (`_fastio.c`; reading in pieces, each hashed in cache, was measured and lost:
 * docs/performance/2026-12-02-verified-reads.md); the peer and object tiers hash piece by piece
 * while bytes land in a host slot (`_checksum.c`). A second pass in Python would cost as much as
 * the read itself on a 2-CPU machine.
 *
 * The progressive form (`struct xxh3_run`) hashes a contiguous buffer as it fills: `feed` folds
 * every whole 1024-byte block the one-shot hash would fold before its last block, `finish` does
 * the rest. The result equals the one-shot hash of the same bytes whatever the pieces were.
 *
 * Block rounds use AVX-512 or AVX2 when the CPU has them (chosen once, at run time), else
 * portable C. Header-only: every function is static, for the two extensions that include it.
 */
#ifndef KVTIER_XXH3_H
#define KVTIER_XXH3_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define XXH3_BLOCK 1024
#define XXH3_STRIPE 64
#define XXH3_MIDSIZE_MAX 240

static const uint64_t P32_1 = 0x9E3779B1U, P32_2 = 0x85EBCA77U, P32_3 = 0xC2B2AE3DU;
static const uint64_t P64_1 = 0x9E3779B185EBCA87ULL, P64_2 = 0xC2B2AE3D27D4EB4FULL,
                      P64_3 = 0x165667B19E3779F9ULL, P64_4 = 0x85EBCA77C2B2AE63ULL,
                      P64_5 = 0x27D4EB2F165667C5ULL;
static const uint64_t PRIME_MX1 = 0x165667919E3779F9ULL, PRIME_MX2 = 0x9FB21C651E98DF25ULL;

static const uint8_t XXH3_SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* -- little helpers: the specification reads everything little-endian -------------------- */
static inline uint64_t xxh3_rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t xxh3_rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh3_fold(uint64_t a, uint64_t b) /* 128-bit product, halves xored */
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t xxh3_avalanche(uint64_t x)
{
    x ^= x >> 37;
    x *= PRIME_MX1;
    return x ^ (x >> 32);
}

static inline uint64_t xxh64_avalanche(uint64_t x)
{
    x ^= x >> 33;
    x *= P64_2;
    x ^= x >> 29;
    x *= P64_3;
    return x ^ (x >> 32);
}

/* The canonical form the `xxhash` package's digest() gives: high half, then low, big-endian. */
static inline void xxh3_canonical(uint64_t low, uint64_t high, uint8_t out[16])
{
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(high >> (56 - 8 * i));
        out[8 + i] = (uint8_t)(low >> (56 - 8 * i));
    }
}

/* -- 0 to 16 bytes ----------------------------------------------------------------------- */
static void xxh3_128_0to16(const uint8_t *in, size_t len, uint64_t *lo, uint64_t *hi)
{
    const uint8_t *s = XXH3_SECRET;
    if (len == 0) {
        *lo = xxh64_avalanche(xxh3_rd64(s + 64) ^ xxh3_rd64(s + 72));
        *hi = xxh64_avalanche(xxh3_rd64(s + 80) ^ xxh3_rd64(s + 88));
    } else if (len <= 3) {
        uint32_t c = (uint32_t)in[len - 1] | ((uint32_t)len << 8) | ((uint32_t)in[0] << 16) |
                     ((uint32_t)in[len >> 1] << 24);
        uint32_t swapped = __builtin_bswap32(c), rotated = (swapped << 13) | (swapped >> 19);
        *lo = xxh64_avalanche((uint64_t)(xxh3_rd32(s) ^ xxh3_rd32(s + 4)) ^ c);
        *hi = xxh64_avalanche((uint64_t)(xxh3_rd32(s + 8) ^ xxh3_rd32(s + 12)) ^ rotated);
    } else if (len <= 8) {
        uint64_t combined = (uint64_t)xxh3_rd32(in) | ((uint64_t)xxh3_rd32(in + len - 4) << 32);
        uint64_t value = (xxh3_rd64(s + 16) ^ xxh3_rd64(s + 24)) ^ combined;
        __uint128_t m = (__uint128_t)value * (P64_1 + ((uint64_t)len << 2));
        uint64_t high = (uint64_t)(m >> 64), low = (uint64_t)m;
        high += low << 1;
        low ^= high >> 3;
        low ^= low >> 35;
        low *= PRIME_MX2;
        *lo = low ^ (low >> 28);
        *hi = xxh3_avalanche(high);
    } else {
        uint64_t first = xxh3_rd64(in), last = xxh3_rd64(in + len - 8);
        uint64_t v1 = (xxh3_rd64(s + 32) ^ xxh3_rd64(s + 40)) ^ first ^ last;
        uint64_t v2 = (xxh3_rd64(s + 48) ^ xxh3_rd64(s + 56)) ^ last;
        __uint128_t m = (__uint128_t)v1 * P64_1;
        uint64_t low = (uint64_t)m + ((uint64_t)(len - 1) << 54);
        uint64_t high = (uint64_t)(m >> 64) + v2 + (uint64_t)(uint32_t)v2 * (P32_2 - 1);
        low ^= __builtin_bswap64(high);
        __uint128_t m2 = (__uint128_t)low * P64_2;
        *lo = xxh3_avalanche((uint64_t)m2);
        *hi = xxh3_avalanche((uint64_t)(m2 >> 64) + high * P64_2);
    }
}

/* -- 17 to 240 bytes --------------------------------------------------------------------- */
static inline uint64_t xxh3_mix16(const uint8_t *d, size_t soff)
{
    const uint8_t *s = XXH3_SECRET + soff;
    return xxh3_fold(xxh3_rd64(d) ^ xxh3_rd64(s), xxh3_rd64(d + 8) ^ xxh3_rd64(s + 8));
}

static inline void xxh3_mix32(uint64_t acc[2], const uint8_t *d1, const uint8_t *d2, size_t soff)
{
    acc[0] += xxh3_mix16(d1, soff);
    acc[1] += xxh3_mix16(d2, soff + 16);
    acc[0] ^= xxh3_rd64(d2) + xxh3_rd64(d2 + 8);
    acc[1] ^= xxh3_rd64(d1) + xxh3_rd64(d1 + 8);
}

static void xxh3_128_17to240(const uint8_t *in, size_t len, uint64_t *lo, uint64_t *hi)
{
    uint64_t acc[2] = {(uint64_t)len * P64_1, 0};
    if (len <= 128) {
        for (int i = (int)((len - 1) >> 5); i >= 0; i--)
            xxh3_mix32(acc, in + 16 * i, in + len - 16 * i - 16, 32 * (size_t)i);
    } else {
        for (size_t i = 0; i < 4; i++)
            xxh3_mix32(acc, in + 32 * i, in + 32 * i + 16, 32 * i);
        acc[0] = xxh3_avalanche(acc[0]);
        acc[1] = xxh3_avalanche(acc[1]);
        for (size_t i = 4; i < (len >> 5); i++)
            xxh3_mix32(acc, in + 32 * i, in + 32 * i + 16, (i - 4) * 32 + 3);
        xxh3_mix32(acc, in + len - 16, in + len - 32, 103);
    }
    *lo = xxh3_avalanche(acc[0] + acc[1]);
    *hi = 0 - xxh3_avalanche(acc[0] * P64_1 + acc[1] * P64_4 + (uint64_t)len * P64_2);
}

/* XXH3-64 of 17 to 128 bytes (kvtier's header checksum covers 104). */
static inline uint64_t xxh3_64_17to128(const uint8_t *in, size_t len)
{
    uint64_t acc = (uint64_t)len * P64_1;
    for (int i = (int)((len - 1) >> 5); i >= 0; i--) {
        acc += xxh3_mix16(in + 16 * i, 32 * (size_t)i);
        acc += xxh3_mix16(in + len - 16 * i - 16, 32 * (size_t)i + 16);
    }
    return xxh3_avalanche(acc);
}

/* -- over 240 bytes: stripes, blocks, merge ------------------------------------------------- */
/* Every block round asks for the line this far ahead: the CPU's own prefetchers stop at each
 * 4 KiB page, and a chunk that an O_DIRECT read left in memory (in no cache) is hashed at
 * memory speed. Measured on a 2-vCPU EPYC VM (benchmarks/payload_passes.py): 2 MiB chunks out
 * of memory at 28 GB/s instead of 23; in cache, no change. A prefetch never faults, so
 * reaching past the input is harmless. */
#define XXH3_PREFETCH_AHEAD 4096
#define XXH3_PREFETCH(p) \
    __builtin_prefetch((const void *)((uintptr_t)(p) + XXH3_PREFETCH_AHEAD)) /* no UB past the end */

static inline void xxh3_stripe(uint64_t acc[8], const uint8_t *stripe, size_t soff)
{
    for (int i = 0; i < 8; i++) {
        uint64_t data = xxh3_rd64(stripe + 8 * i);
        uint64_t value = data ^ xxh3_rd64(XXH3_SECRET + soff + 8 * i);
        acc[i ^ 1] += data;
        acc[i] += (value & 0xFFFFFFFFU) * (value >> 32);
    }
}

static void xxh3_blocks_c(uint64_t acc[8], const uint8_t *in, size_t blocks)
{
    for (size_t b = 0; b < blocks; b++, in += XXH3_BLOCK) {
        for (size_t n = 0; n < 16; n++) {
            XXH3_PREFETCH(in + 64 * n);
            xxh3_stripe(acc, in + 64 * n, 8 * n);
        }
        for (int i = 0; i < 8; i++) {
            uint64_t a = acc[i] ^ (acc[i] >> 47);
            acc[i] = (a ^ xxh3_rd64(XXH3_SECRET + 128 + 8 * i)) * P32_1;
        }
    }
}

#if defined(__x86_64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
__attribute__((target("avx2"))) static void xxh3_blocks_avx2(uint64_t acc[8], const uint8_t *in,
                                                              size_t blocks)
{
    __m256i a[2] = {_mm256_loadu_si256((const __m256i *)acc),
                    _mm256_loadu_si256((const __m256i *)(acc + 4))};
    const __m256i prime = _mm256_set1_epi64x((long long)P32_1);
    for (size_t b = 0; b < blocks; b++, in += XXH3_BLOCK) {
        for (size_t n = 0; n < 16; n++) {
            XXH3_PREFETCH(in + 64 * n);
            for (int h = 0; h < 2; h++) {
                __m256i d = _mm256_loadu_si256((const __m256i *)(in + 64 * n + 32 * h));
                __m256i k = _mm256_loadu_si256((const __m256i *)(XXH3_SECRET + 8 * n + 32 * h));
                __m256i dk = _mm256_xor_si256(d, k);
                __m256i product = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
                __m256i swapped = _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2));
                a[h] = _mm256_add_epi64(a[h], _mm256_add_epi64(swapped, product));
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256i k = _mm256_loadu_si256((const __m256i *)(XXH3_SECRET + 128 + 32 * h));
            __m256i x = _mm256_xor_si256(_mm256_xor_si256(a[h], _mm256_srli_epi64(a[h], 47)), k);
            __m256i low = _mm256_mul_epu32(x, prime);
            __m256i high = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), prime);
            a[h] = _mm256_add_epi64(low, _mm256_slli_epi64(high, 32));
        }
    }
    _mm256_storeu_si256((__m256i *)acc, a[0]);
    _mm256_storeu_si256((__m256i *)(acc + 4), a[1]);
}

__attribute__((target("avx512f"))) static void xxh3_blocks_avx512(uint64_t acc[8],
                                                                   const uint8_t *in,
                                                                   size_t blocks)
{
    __m512i a = _mm512_loadu_si512(acc);
    const __m512i prime = _mm512_set1_epi64((long long)P32_1);
    const __m512i scramble = _mm512_loadu_si512(XXH3_SECRET + 128);
    for (size_t b = 0; b < blocks; b++, in += XXH3_BLOCK) {
        for (size_t n = 0; n < 16; n++) {
            XXH3_PREFETCH(in + 64 * n);
            __m512i d = _mm512_loadu_si512(in + 64 * n);
            __m512i dk = _mm512_xor_si512(d, _mm512_loadu_si512(XXH3_SECRET + 8 * n));
            __m512i product = _mm512_mul_epu32(dk, _mm512_srli_epi64(dk, 32));
            __m512i swapped = _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2));
            a = _mm512_add_epi64(a, _mm512_add_epi64(swapped, product));
        }
        __m512i x = _mm512_xor_si512(_mm512_xor_si512(a, _mm512_srli_epi64(a, 47)), scramble);
        __m512i low = _mm512_mul_epu32(x, prime);
        __m512i high = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), prime);
        a = _mm512_add_epi64(low, _mm512_slli_epi64(high, 32));
    }
    _mm512_storeu_si512(acc, a);
}
#endif

typedef void (*xxh3_blocks_fn)(uint64_t acc[8], const uint8_t *in, size_t blocks);

/* The fastest block round this CPU runs (the choice is the same every call: no lock needed). */
static xxh3_blocks_fn xxh3_blocks_impl(void)
{
    static xxh3_blocks_fn chosen;
    if (chosen)
        return chosen;
    xxh3_blocks_fn pick = xxh3_blocks_c;
#if defined(__x86_64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        pick = xxh3_blocks_avx512;
    else if (__builtin_cpu_supports("avx2"))
        pick = xxh3_blocks_avx2;
#endif
    return chosen = pick;
}

static uint64_t xxh3_merge(const uint64_t acc[8], uint64_t init, size_t soff)
{
    const uint8_t *s = XXH3_SECRET + soff;
    for (int i = 0; i < 4; i++)
        init += xxh3_fold(acc[2 * i] ^ xxh3_rd64(s + 16 * i), acc[2 * i + 1] ^ xxh3_rd64(s + 16 * i + 8));
    return xxh3_avalanche(init);
}

/* -- the progressive form ------------------------------------------------------------------ */
struct xxh3_run {
    uint64_t acc[8];
    size_t folded; /* bytes from the start already folded, whole blocks */
};

static void xxh3_run_init(struct xxh3_run *r)
{
    const uint64_t init[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    memcpy(r->acc, init, sizeof init);
    r->folded = 0;
}

/* Fold the whole blocks of in[folded:avail] that the hash of a len-byte input folds before
 * its last block. in[0:avail] must hold the input's first avail bytes. */
static void xxh3_run_feed(struct xxh3_run *r, const uint8_t *in, size_t avail, size_t len)
{
    if (len <= XXH3_MIDSIZE_MAX)
        return;
    size_t last = (len - 1) / XXH3_BLOCK * XXH3_BLOCK; /* the last block is never folded whole */
    size_t upto = avail < last ? avail / XXH3_BLOCK * XXH3_BLOCK : last;
    if (upto > r->folded) {
        xxh3_blocks_impl()(r->acc, in + r->folded, (upto - r->folded) / XXH3_BLOCK);
        r->folded = upto;
    }
}

/* XXH3-128 of in[0:len], all of it in memory now, in its canonical 16 bytes. */
static void xxh3_run_finish(struct xxh3_run *r, const uint8_t *in, size_t len, uint8_t out[16])
{
    uint64_t lo, hi;
    if (len <= 16) {
        xxh3_128_0to16(in, len, &lo, &hi);
    } else if (len <= XXH3_MIDSIZE_MAX) {
        xxh3_128_17to240(in, len, &lo, &hi);
    } else {
        xxh3_run_feed(r, in, len, len);
        size_t tail = len - r->folded; /* 1 to XXH3_BLOCK bytes */
        for (size_t n = 0; n < (tail - 1) / XXH3_STRIPE; n++)
            xxh3_stripe(r->acc, in + r->folded + 64 * n, 8 * n);
        xxh3_stripe(r->acc, in + len - XXH3_STRIPE, sizeof XXH3_SECRET - 71);
        lo = xxh3_merge(r->acc, (uint64_t)len * P64_1, 11);
        hi = xxh3_merge(r->acc, ~((uint64_t)len * P64_2), sizeof XXH3_SECRET - 75);
    }
    xxh3_canonical(lo, hi, out);
}

static void xxh3_128(const uint8_t *in, size_t len, uint8_t out[16])
{
    struct xxh3_run r;
    xxh3_run_init(&r);
    xxh3_run_finish(&r, in, len, out);
}

#endif
