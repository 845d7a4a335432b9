/* Big-endian integers as tables/operators/keys.py packs them (struct ">Q", ">I"; a time is
   ts + 2**63: FJ_SIGN), for the compiled loops _fastjoin.pyx and _fastwindow.pyx, which
   include this file from their C code (setup.py lists it as both extensions' dependency). */
#ifndef TANDEM_BIGENDIAN_H
#define TANDEM_BIGENDIAN_H

#include <stdint.h>

#define FJ_SIGN 0x8000000000000000ULL

static inline void fj_be64(char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) { p[i] = (char)(v & 0xff); v >>= 8; }
}

static inline uint64_t fj_read_be64(const char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | (unsigned char)p[i];
    return v;
}

static inline void fj_be32(char *p, uint32_t v) {
    for (int i = 3; i >= 0; i--) { p[i] = (char)(v & 0xff); v >>= 8; }
}

static inline uint32_t fj_read_be32(const char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = (v << 8) | (unsigned char)p[i];
    return v;
}

#endif
