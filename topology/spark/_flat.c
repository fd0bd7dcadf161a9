/* topology.spark._flat: FlatDecoder's one-pass kernel (see topology/spark/arrow.py, FlatDecoder).
 *
 * Why C: the numpy decoder makes about 60 passes over a reply's items (gathers at unaligned offsets, a pass per
 * key and value position, a byte index per string column): 600 us of a Spark Python worker's CPU per
 * 8,192-record reply of the benchmark's records. One pass over the bytes does the same in about a third of
 * that, the arrays' allocation included (docs/performance.md, issue 28, session 19). It is a plain CPython
 * extension (no Cython, no numba: nothing to install, nothing to import or compile in a new Spark Python
 * worker), built by setup.py where a C compiler is; without it the numpy decoder runs.
 *
 * It decodes only what it is sure of, and gives the batch up (returns 1) at anything else: then the numpy
 * decoder runs, which keeps FlatDecoder's semantics exactly whatever the kernel skips. Besides what the numpy
 * decoder gives up on, the kernel gives up on any string byte >= 0x80 (it checks no UTF-8: ASCII is UTF-8), in
 * the keys it does not match as in the values, and on a record of more than 64 fields' worth of columns.
 *
 * A record must be a msgpack map (fixmap, map16, map32) of str keys and scalar values, ending where the next
 * record starts. Per column f (a valueSchema field), the kernel writes:
 *   valid[f][r]   1 where record r has a non-nil value for f, else 0 (absent or nil: null)
 *   ivals[f][r]   int columns: the value (0 where null); bool columns: 0 / 1
 *   fvals[f][r]   double columns: the value, float32 widened, ints below 2**53 converted (0 where null)
 *   chars[f]      string columns: the values' bytes back to back (`cap` bytes a row: the reply's size + 8,
 *                 for 8-byte stores past a value's end), soffs[f][r] their offsets (n + 1 a row)
 *   counts[f]     string columns: the bytes in chars[f]; counts[F + f]: the non-null values of f
 * and gives up on a value of the wrong type (a float for an int column, an int out of the column's range,
 * a double column's int of 2**53 or more, a bin, ext, container or uint64 past int64 for any column) and on a
 * key given twice in one record (the general decoder keeps the last).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { K_STR = 0, K_INT = 1, K_FLOAT = 2, K_BOOL = 3 };
enum { V_NIL = 1, V_BOOL, V_INT, V_FLOAT, V_STR, V_OTHER };
#define MAX_FIELDS 64
#define EXPECTED 16 /* key positions whose field is remembered from the record before */

static inline uint64_t be(const uint8_t *p, int nb) {
    uint64_t u = 0;
    for (int k = 0; k < nb; k++) u = (u << 8) | p[k];
    return u;
}

static inline uint64_t load8(const uint8_t *p) {
    uint64_t u;
    memcpy(&u, p, 8);
    return u;
}

static inline uint64_t low_bytes(int64_t len) { /* a mask of a little-endian word's first len bytes */
    return len >= 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * len)) - 1);
}

static inline int ascii(const uint8_t *p, int64_t len) {
    uint8_t any = 0;
    for (int64_t k = 0; k < len; k++) any |= p[k];
    return any < 0x80;
}

/* Whether the klen bytes at buf + p are field g's name; an 8-byte compare where the buffer has the bytes
 * (names is padded with 8 bytes). */
static inline int is_name(const uint8_t *buf, int64_t p, int64_t klen, int64_t bsize, const uint8_t *names,
                          const int64_t *name_off, int64_t g) {
    const uint8_t *name = names + name_off[g];
    if (name_off[g + 1] - name_off[g] != klen) return 0;
    if (klen <= 8 && p + 8 <= bsize) return ((load8(buf + p) ^ load8(name)) & low_bytes(klen)) == 0;
    return memcmp(buf + p, name, (size_t)klen) == 0;
}

typedef struct {
    const uint8_t *buf, *names;
    const int32_t *bounds;
    const int64_t *name_off, *lo, *hi;
    const int8_t *kinds;
    int64_t n, nfields, cap;
    int64_t *ivals, *counts;
    double *fvals;
    int32_t *soffs;
    uint8_t *chars, *valid;
} Job;

static int decode(const Job *j) {
    const uint8_t *buf = j->buf;
    const int64_t n = j->n, F = j->nfields, bsize = j->bounds[n];
    int64_t seen[MAX_FIELDS];
    int64_t expect[EXPECTED];
    int64_t *nchars = j->counts, *nvalid = j->counts + F;
    for (int64_t f = 0; f < F; f++) {
        seen[f] = -1;
        nchars[f] = nvalid[f] = 0;
        j->soffs[f * (n + 1)] = 0;
    }
    for (int e = 0; e < EXPECTED; e++) expect[e] = -1;
    for (int64_t r = 0; r < n; r++) {
        int64_t p = j->bounds[r], end = j->bounds[r + 1], cnt;
        if (p >= end || end > bsize) return 1;
        uint8_t h = buf[p];
        if ((h & 0xF0) == 0x80) { cnt = h & 0x0F; p += 1; }
        else if (h == 0xDE) { if (p + 3 > end) return 1; cnt = (int64_t)be(buf + p + 1, 2); p += 3; }
        else if (h == 0xDF) { if (p + 5 > end) return 1; cnt = (int64_t)be(buf + p + 1, 4); p += 5; }
        else return 1;
        for (int64_t f = 0; f < F; f++) j->valid[f * n + r] = 0;
        for (int64_t e = 0; e < cnt; e++) {
            if (p >= end) return 1;
            uint8_t t = buf[p];
            int64_t klen;
            if ((t & 0xE0) == 0xA0) { klen = t & 0x1F; p += 1; }
            else if (t == 0xD9) { if (p + 2 > end) return 1; klen = buf[p + 1]; p += 2; }
            else if (t == 0xDA) { if (p + 3 > end) return 1; klen = (int64_t)be(buf + p + 1, 2); p += 3; }
            else if (t == 0xDB) { if (p + 5 > end) return 1; klen = (int64_t)be(buf + p + 1, 4); p += 5; }
            else return 1;
            if (p + klen >= end) return 1; /* a value must follow */
            int64_t match = -1, g = e < EXPECTED ? expect[e] : -1;
            if (g >= 0 && is_name(buf, p, klen, bsize, j->names, j->name_off, g)) match = g;
            if (match < 0) {
                for (int64_t f = 0; f < F; f++)
                    if (is_name(buf, p, klen, bsize, j->names, j->name_off, f)) { match = f; break; }
                if (e < EXPECTED) expect[e] = match;
                if (match < 0 && !ascii(buf + p, klen)) return 1;
            }
            p += klen;
            t = buf[p];
            int vk;
            int64_t iv = 0, size = 1, sstart = 0;
            double fv = 0;
            if (t <= 0x7F) { vk = V_INT; iv = t; }
            else if (t >= 0xE0) { vk = V_INT; iv = (int64_t)t - 256; }
            else if ((t & 0xE0) == 0xA0) { vk = V_STR; sstart = p + 1; size = 1 + (t & 0x1F); }
            else if (t == 0xC0) vk = V_NIL;
            else if (t == 0xC2 || t == 0xC3) vk = V_BOOL;
            else if (t >= 0xCC && t <= 0xD3) { /* uint 8-64, int 8-64 */
                int nb = 1 << ((t - 0xCC) & 3);
                size = 1 + nb;
                if (p + size > end) return 1;
                uint64_t u = be(buf + p + 1, nb);
                vk = V_INT;
                if (t <= 0xCF) {
                    if (u >> 63) vk = V_OTHER; /* a uint64 past int64: no column takes it */
                    iv = (int64_t)u;
                } else {
                    int sh = 64 - 8 * nb;
                    iv = (int64_t)(u << sh) >> sh;
                }
            } else if (t == 0xCA) {
                size = 5;
                if (p + size > end) return 1;
                uint32_t u = (uint32_t)be(buf + p + 1, 4);
                float x;
                memcpy(&x, &u, 4);
                fv = x;
                vk = V_FLOAT;
            } else if (t == 0xCB) {
                size = 9;
                if (p + size > end) return 1;
                uint64_t u = be(buf + p + 1, 8);
                memcpy(&fv, &u, 8);
                vk = V_FLOAT;
            } else if (t == 0xD9 || t == 0xDA || t == 0xDB || t == 0xC4 || t == 0xC5 || t == 0xC6) { /* str, bin */
                int nb = (t == 0xD9 || t == 0xC4) ? 1 : (t == 0xDA || t == 0xC5) ? 2 : 4;
                if (p + 1 + nb > end) return 1;
                sstart = p + 1 + nb;
                size = 1 + nb + (int64_t)be(buf + p + 1, nb);
                vk = t >= 0xD9 ? V_STR : V_OTHER;
            } else if (t == 0x80 || t == 0x90) vk = V_OTHER; /* empty map / array */
            else if (t >= 0xD4 && t <= 0xD8) { size = 2 + (1 << (t - 0xD4)); vk = V_OTHER; } /* fixext */
            else if (t == 0xC7 || t == 0xC8 || t == 0xC9) { /* ext 8-32 */
                int nb = t == 0xC7 ? 1 : t == 0xC8 ? 2 : 4;
                if (p + 1 + nb > end) return 1;
                size = 2 + nb + (int64_t)be(buf + p + 1, nb);
                vk = V_OTHER;
            } else return 1; /* a non-empty container, or 0xc1 */
            if (p + size > end) return 1;
            if (match < 0) { /* a field the columns do not take: skipped, but its strings must be ASCII here */
                if (vk == V_STR && !ascii(buf + sstart, p + size - sstart)) return 1;
            } else {
                int64_t f = match;
                if (seen[f] == r) return 1; /* a key twice in one record */
                seen[f] = r;
                if (vk != V_NIL) {
                    switch (j->kinds[f]) {
                    case K_STR: {
                        if (vk != V_STR) return 1;
                        int64_t len = p + size - sstart;
                        uint8_t *out = j->chars + f * j->cap + nchars[f];
                        if (len <= 8 && sstart + 8 <= bsize) { /* one word (chars has 8 bytes to spare) */
                            uint64_t w = load8(buf + sstart);
                            if (w & low_bytes(len) & 0x8080808080808080ULL) return 1;
                            memcpy(out, &w, 8);
                        } else {
                            if (!ascii(buf + sstart, len)) return 1;
                            memcpy(out, buf + sstart, (size_t)len);
                        }
                        nchars[f] += len;
                        break;
                    }
                    case K_INT:
                        if (vk != V_INT || iv < j->lo[f] || iv > j->hi[f]) return 1;
                        j->ivals[f * n + r] = iv;
                        break;
                    case K_FLOAT:
                        if (vk == V_FLOAT) j->fvals[f * n + r] = fv;
                        else if (vk == V_INT && iv > -(INT64_C(1) << 53) && iv < (INT64_C(1) << 53))
                            j->fvals[f * n + r] = (double)iv;
                        else return 1;
                        break;
                    default:
                        if (vk != V_BOOL) return 1;
                        j->ivals[f * n + r] = t == 0xC3;
                    }
                    j->valid[f * n + r] = 1;
                    nvalid[f]++;
                }
            }
            p += size;
        }
        if (p != end) return 1;
        for (int64_t f = 0; f < F; f++) {
            j->soffs[f * (n + 1) + r + 1] = (int32_t)nchars[f];
            if (!j->valid[f * n + r]) {
                j->ivals[f * n + r] = 0;
                j->fvals[f * n + r] = 0;
            }
        }
    }
    return 0;
}

static int big_enough(const Py_buffer *b, Py_ssize_t need, const char *what) {
    if (b->len < need) {
        PyErr_Format(PyExc_ValueError, "_flat.decode: %s holds %zd bytes, needs %zd", what, b->len, need);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(decode_doc,
"decode(buf, bounds, names, name_off, kinds, lo, hi, ivals, fvals, soffs, chars, valid, counts) -> bool\n\n"
"Decode the n = len(bounds) / 4 - 1 msgpack map records buf[bounds[r]:bounds[r + 1]] into per-field columns\n"
"(F = len(kinds) fields; see the top of _flat.c). True if decoded, False if the numpy decoder must decide.");

static PyObject *py_decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer in[7], out[6];
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*w*w*w*w*w*w*:decode", &in[0], &in[1], &in[2], &in[3], &in[4],
                          &in[5], &in[6], &out[0], &out[1], &out[2], &out[3], &out[4], &out[5]))
        return NULL;
    Job j;
    j.nfields = in[4].len;
    j.n = in[1].len / 4 - 1;
    if (j.n < 0 || j.nfields < 1 || j.nfields > MAX_FIELDS) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    j.buf = in[0].buf;
    j.bounds = in[1].buf;
    j.names = in[2].buf;
    j.name_off = in[3].buf;
    j.kinds = in[4].buf;
    j.lo = in[5].buf;
    j.hi = in[6].buf;
    j.ivals = out[0].buf;
    j.fvals = out[1].buf;
    j.soffs = out[2].buf;
    j.chars = out[3].buf;
    j.valid = out[4].buf;
    j.counts = out[5].buf;
    const int64_t n = j.n, F = j.nfields;
    if (!big_enough(&in[3], 8 * (F + 1), "name_off") || !big_enough(&in[5], 8 * F, "lo")
        || !big_enough(&in[6], 8 * F, "hi") || !big_enough(&out[0], 8 * F * n, "ivals")
        || !big_enough(&out[1], 8 * F * n, "fvals") || !big_enough(&out[2], 4 * F * (n + 1), "soffs")
        || !big_enough(&out[4], F * n, "valid") || !big_enough(&out[5], 16 * F, "counts"))
        goto done;
    if (!big_enough(&in[2], j.name_off[F] + 8, "names (padded by 8 bytes)")) goto done;
    for (int64_t f = 0; f < F; f++)
        if (j.name_off[f] < 0 || j.name_off[f] > j.name_off[f + 1]) {
            PyErr_SetString(PyExc_ValueError, "_flat.decode: name_off must be ascending");
            goto done;
        }
    int64_t first = j.bounds[0], bsize = j.bounds[n];
    j.cap = F ? out[3].len / F : 0;
    if (first < 0 || bsize > in[0].len || j.cap < bsize + 8) {
        PyErr_Format(PyExc_ValueError, "_flat.decode: records [%lld, %lld) outside buf (%zd bytes) or chars rows "
                     "of %lld bytes (needs %lld)", (long long)first, (long long)bsize, in[0].len, (long long)j.cap,
                     (long long)bsize + 8);
        goto done;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = decode(&j);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(rc == 0 ? Py_True : Py_False);
done:
    for (int k = 0; k < 7; k++) if (in[k].obj) PyBuffer_Release(&in[k]);
    for (int k = 0; k < 6; k++) if (out[k].obj) PyBuffer_Release(&out[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "topology.spark._flat",
    .m_doc = "FlatDecoder's one-pass kernel (see _flat.c).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__flat(void) { return PyModule_Create(&module); }
