/* CRC32C (Castagnoli) for kcore's codec.
 *
 * x86-64 with SSE4.2: the crc32 instruction over three interleaved streams (its latency is
 * three cycles, its throughput one a cycle, so three independent streams keep it busy), the
 * stream CRCs joined with precomputed "append N zero bytes" operators. ARMv8 with the CRC
 * extension: its crc32c instructions. Elsewhere, and for short tails: slicing-by-8 tables.
 * The implementation is chosen once, at run time, from what the CPU reports.
 *
 * kcore_crc32c_join gives the CRC of A then B from the CRCs of A and of B and B's length, so a
 * batch's records can be checksummed as they are written (while their bytes are in the
 * writer's cache) and the header, known only when the batch is built, put in front after.
 */
#ifndef KCORE_CRC32C_H
#define KCORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KCORE_CRC32C_POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t kcore_crc_table[8][256];

/* Operators that advance a raw CRC register over LONG or SHORT zero bytes, as four byte tables. */
#define KCORE_CRC_LONG 8192
#define KCORE_CRC_SHORT 256
static uint32_t kcore_crc_long[4][256];
static uint32_t kcore_crc_short[4][256];

/* GF(2) 32x32 matrix times vector: the columns of mat are the images of each bit. */
static uint32_t kcore_gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void kcore_gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = kcore_gf2_times(mat, mat[n]);
}

/* Build the byte tables of the operator that feeds `len` zero bytes through the register. */
static void kcore_crc_zeros(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32], sq[32], acc[32];
    /* One zero bit: shift right, and fold in the polynomial when the low bit falls out. */
    op[0] = KCORE_CRC32C_POLY;
    for (int n = 1; n < 32; n++) op[n] = 1u << (n - 1);
    /* op^2 (two bits), op^4 (four), op^8 = one zero byte. */
    kcore_gf2_square(sq, op);
    kcore_gf2_square(op, sq);
    kcore_gf2_square(sq, op); /* sq = one byte */
    /* acc = identity, then multiply in sq^(2^k) for each set bit k of len (bytes). */
    for (int n = 0; n < 32; n++) acc[n] = 1u << n;
    while (len) {
        if (len & 1) {
            uint32_t tmp[32];
            for (int n = 0; n < 32; n++) tmp[n] = kcore_gf2_times(sq, acc[n]);
            memcpy(acc, tmp, sizeof(acc));
        }
        len >>= 1;
        if (!len) break;
        kcore_gf2_square(op, sq);
        memcpy(sq, op, sizeof(sq));
    }
    for (uint32_t b = 0; b < 256; b++) {
        zeros[0][b] = kcore_gf2_times(acc, b);
        zeros[1][b] = kcore_gf2_times(acc, b << 8);
        zeros[2][b] = kcore_gf2_times(acc, b << 16);
        zeros[3][b] = kcore_gf2_times(acc, b << 24);
    }
}

/* Polynomials mod P in the CRC's bit order (bit 31 is x^0): a * b mod P. */
static uint32_t kcore_crc_mulmod(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
        if (a & bit) product ^= b;
        b = (b & 1) ? (b >> 1) ^ KCORE_CRC32C_POLY : b >> 1; /* b * x */
    }
    return product;
}

/* x^(2^k) mod P for k = 0..66: appending n bytes multiplies the register by x^(8n), and a
 * 64-bit n has its top bit at k = 3 + 63. */
#define KCORE_CRC_X2K 67
static uint32_t kcore_crc_x2k[KCORE_CRC_X2K];

static uint32_t kcore_crc32c_join(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    uint32_t op = 1u << 31; /* x^0 */
    for (unsigned k = 3; len_b; len_b >>= 1, k++) {
        if (len_b & 1) op = kcore_crc_mulmod(kcore_crc_x2k[k], op);
    }
    return kcore_crc_mulmod(op, crc_a) ^ crc_b;
}

static inline uint32_t kcore_crc_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

static uint32_t kcore_crc32c_sw(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = kcore_crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint32_t lo = (uint32_t)w ^ crc, hi = (uint32_t)(w >> 32);
        crc = kcore_crc_table[7][lo & 0xff] ^ kcore_crc_table[6][(lo >> 8) & 0xff] ^
              kcore_crc_table[5][(lo >> 16) & 0xff] ^ kcore_crc_table[4][lo >> 24] ^
              kcore_crc_table[3][hi & 0xff] ^ kcore_crc_table[2][(hi >> 8) & 0xff] ^
              kcore_crc_table[1][(hi >> 16) & 0xff] ^ kcore_crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = kcore_crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KCORE_CRC_HW 1
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t kcore_crc32c_hw(uint32_t crc, const uint8_t *p,
                                                                  size_t n) {
    uint64_t c0 = (uint32_t)~crc;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    /* Three streams of LONG bytes, then of SHORT bytes, joined by the zero-byte operators. */
    while (n >= 3 * KCORE_CRC_LONG) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + KCORE_CRC_LONG;
        do {
            uint64_t a, b, c;
            memcpy(&a, p, 8);
            memcpy(&b, p + KCORE_CRC_LONG, 8);
            memcpy(&c, p + 2 * KCORE_CRC_LONG, 8);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, c);
            p += 8;
        } while (p < end);
        c0 = kcore_crc_shift(kcore_crc_long, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = kcore_crc_shift(kcore_crc_long, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * KCORE_CRC_LONG;
        n -= 3 * KCORE_CRC_LONG;
    }
    while (n >= 3 * KCORE_CRC_SHORT) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *end = p + KCORE_CRC_SHORT;
        do {
            uint64_t a, b, c;
            memcpy(&a, p, 8);
            memcpy(&b, p + KCORE_CRC_SHORT, 8);
            memcpy(&c, p + 2 * KCORE_CRC_SHORT, 8);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, c);
            p += 8;
        } while (p < end);
        c0 = kcore_crc_shift(kcore_crc_short, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = kcore_crc_shift(kcore_crc_short, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * KCORE_CRC_SHORT;
        n -= 3 * KCORE_CRC_SHORT;
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c0 = _mm_crc32_u64(c0, a);
        p += 8;
        n -= 8;
    }
    while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}

static int kcore_cpu_has_crc(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

#elif defined(__aarch64__) && defined(__GNUC__) && (defined(__linux__) || defined(__APPLE__))
/* The compilers' CRC builtins, in a function compiled for the CRC extension whatever the
 * build's baseline; used only where the CPU reports it. */
#define KCORE_CRC_HW 1
#ifdef __APPLE__
#include <sys/sysctl.h>
#else
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

#ifdef __clang__
#define KCORE_TARGET_CRC __attribute__((target("crc")))
#define KCORE_CRC32CB __builtin_arm_crc32cb
#define KCORE_CRC32CD __builtin_arm_crc32cd
#else
#define KCORE_TARGET_CRC __attribute__((target("+crc")))
#define KCORE_CRC32CB __builtin_aarch64_crc32cb
#define KCORE_CRC32CD __builtin_aarch64_crc32cx
#endif

KCORE_TARGET_CRC static uint32_t kcore_crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = KCORE_CRC32CB(crc, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        crc = KCORE_CRC32CD(crc, a);
        p += 8;
        n -= 8;
    }
    while (n--) crc = KCORE_CRC32CB(crc, *p++);
    return ~crc;
}

#ifdef __APPLE__
static int kcore_cpu_has_crc(void) {
    int has = 0;
    size_t size = sizeof(has);
    return sysctlbyname("hw.optional.armv8_crc32", &has, &size, NULL, 0) == 0 && has;
}
#else
static int kcore_cpu_has_crc(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#endif

#else
#define KCORE_CRC_HW 0
static uint32_t kcore_crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    return kcore_crc32c_sw(crc, p, n);
}
static int kcore_cpu_has_crc(void) { return 0; }
#endif

static int kcore_crc_use_hw = 0;

/* Fill the tables and pick the implementation; `force_sw` keeps the table path (for tests). */
static void kcore_crc32c_init(int force_sw) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ ((crc & 1) ? KCORE_CRC32C_POLY : 0);
        kcore_crc_table[0][i] = crc;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = kcore_crc_table[0][i];
        for (int k = 1; k < 8; k++) {
            crc = kcore_crc_table[0][crc & 0xff] ^ (crc >> 8);
            kcore_crc_table[k][i] = crc;
        }
    }
    kcore_crc_x2k[0] = 1u << 30; /* x^1 */
    for (int k = 1; k < KCORE_CRC_X2K; k++)
        kcore_crc_x2k[k] = kcore_crc_mulmod(kcore_crc_x2k[k - 1], kcore_crc_x2k[k - 1]);
    kcore_crc_zeros(kcore_crc_long, KCORE_CRC_LONG);
    kcore_crc_zeros(kcore_crc_short, KCORE_CRC_SHORT);
    kcore_crc_use_hw = !force_sw && KCORE_CRC_HW && kcore_cpu_has_crc();
}

static inline uint32_t kcore_crc32c(uint32_t crc, const uint8_t *p, size_t n) {
    return kcore_crc_use_hw ? kcore_crc32c_hw(crc, p, n) : kcore_crc32c_sw(crc, p, n);
}

#endif
