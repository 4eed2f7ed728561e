/* Small checksums the record formats need besides CRC32C:
 * - CRC-32 (IEEE, zlib's) over legacy v0/v1 messages;
 * - xxHash32, for the header checksum byte of an LZ4 frame. */
#ifndef KCORE_CHECKSUMS_H
#define KCORE_CHECKSUMS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t kcore_crc32_table[256];

static void kcore_crc32_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ ((c & 1) ? 0xEDB88320u : 0);
        kcore_crc32_table[i] = c;
    }
}

static uint32_t kcore_crc32_ieee(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n--) crc = kcore_crc32_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#define KCORE_XXH_P1 2654435761u
#define KCORE_XXH_P2 2246822519u
#define KCORE_XXH_P3 3266489917u
#define KCORE_XXH_P4 668265263u
#define KCORE_XXH_P5 374761393u

static inline uint32_t kcore_rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline uint32_t kcore_read_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint32_t kcore_xxh_round(uint32_t acc, uint32_t input) {
    acc += input * KCORE_XXH_P2;
    return kcore_rotl32(acc, 13) * KCORE_XXH_P1;
}

static uint32_t kcore_xxh32(const uint8_t *p, size_t len, uint32_t seed) {
    const uint8_t *end = p + len;
    uint32_t h;
    if (len >= 16) {
        uint32_t v1 = seed + KCORE_XXH_P1 + KCORE_XXH_P2, v2 = seed + KCORE_XXH_P2, v3 = seed,
                 v4 = seed - KCORE_XXH_P1;
        const uint8_t *limit = end - 16;
        do {
            v1 = kcore_xxh_round(v1, kcore_read_le32(p));
            v2 = kcore_xxh_round(v2, kcore_read_le32(p + 4));
            v3 = kcore_xxh_round(v3, kcore_read_le32(p + 8));
            v4 = kcore_xxh_round(v4, kcore_read_le32(p + 12));
            p += 16;
        } while (p <= limit);
        h = kcore_rotl32(v1, 1) + kcore_rotl32(v2, 7) + kcore_rotl32(v3, 12) + kcore_rotl32(v4, 18);
    } else {
        h = seed + KCORE_XXH_P5;
    }
    h += (uint32_t)len;
    while (p + 4 <= end) {
        h += kcore_read_le32(p) * KCORE_XXH_P3;
        h = kcore_rotl32(h, 17) * KCORE_XXH_P4;
        p += 4;
    }
    while (p < end) {
        h += (*p++) * KCORE_XXH_P5;
        h = kcore_rotl32(h, 11) * KCORE_XXH_P1;
    }
    h ^= h >> 15;
    h *= KCORE_XXH_P2;
    h ^= h >> 13;
    h *= KCORE_XXH_P3;
    h ^= h >> 16;
    return h;
}

#endif
