/* Iteration samples and the growth detector (the verdict `memtrace report` gives; the
 * rule is in report.h). */
#include <stdlib.h>
#include <string.h>

#include "analysis/model_internal.h"
#include "memtrace/common.h"

int mt__model_iteration(mt_model_t *m, uint64_t iteration)
{
    if (m->nit == m->capit) {
        size_t cap = m->capit ? 2 * m->capit : 4; /* a sample is 280 bytes: from a few */
        uint64_t *no = realloc(m->it_no, cap * sizeof(*no));
        if (no)
            m->it_no = no;
        double *al = realloc(m->it_alloc, cap * sizeof(*al));
        if (al)
            m->it_alloc = al;
        double(*tg)[MT_TAG_MAX] = realloc(m->it_tag, cap * sizeof(*tg));
        if (tg)
            m->it_tag = tg;
        uint64_t *pk = realloc(m->it_peak, cap * sizeof(*pk));
        if (pk)
            m->it_peak = pk;
        if (!no || !al || !tg || !pk)
            return MT_ENOMEM;
        m->capit = cap;
    }
    const mt__mclass_t *c = &m->cls[MT_MODEL_DEVICE];
    uint64_t now = mt__model_sat(c->asum);
    if (m->nit > 0)
        m->it_peak[m->nit - 1] = m->span_peak; /* the span the previous mark opened ends */
    m->span_peak = now;
    m->it_no[m->nit] = iteration;
    m->it_alloc[m->nit] = (double)now;
    for (int t = 0; t < MT_TAG_MAX; t++)
        m->it_tag[m->nit][t] = (double)mt__model_sat(c->tag_bytes[t] + c->unc_bytes[t]);
    m->nit++;
    return 0;
}

void mt__model_iterations_free(mt_model_t *m)
{
    free(m->it_no);
    free(m->it_alloc);
    free(m->it_tag);
    free(m->it_peak);
    m->it_peak = NULL;
    m->it_no = NULL;
    m->it_alloc = NULL;
    m->it_tag = NULL;
    m->nit = m->capit = 0;
}

/* Least squares y = a + b x over x = 0..n-1 (y[i * stride]). */
static mt_model_fit_t fit_line(const mt_model_growth_cfg_t *cfg, const double *y, size_t stride,
                               size_t n)
{
    mt_model_fit_t f = {0};
    if (n < 2)
        return f;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) {
        double v = y[i * stride];
        sx += (double)i;
        sy += v;
        sxx += (double)i * (double)i;
        sxy += (double)i * v;
    }
    double dn = (double)n, den = dn * sxx - sx * sx;
    f.slope = (dn * sxy - sx * sy) / den;
    double a = (sy - f.slope * sx) / dn, mean = sy / dn, ssr = 0, sst = 0;
    size_t up = 0;
    for (size_t i = 0; i < n; i++) {
        double v = y[i * stride], d = v - (a + f.slope * (double)i);
        ssr += d * d;
        sst += (v - mean) * (v - mean);
        if (i + 1 < n && y[(i + 1) * stride] >= v)
            up++;
    }
    f.r2 = sst > 0 ? 1.0 - ssr / sst : 0.0;
    f.rise = y[(n - 1) * stride] - y[0];
    f.nondecr = (double)up / (double)(n - 1);
    f.detected = n >= 3 && f.slope > 0 && f.r2 >= cfg->min_r2 &&
                 f.rise >= (double)cfg->min_growth_bytes && f.nondecr >= 0.75;
    return f;
}

void mt__model_growth(const mt_model_t *m, const mt_model_growth_cfg_t *cfg, mt_model_growth_t *out)
{
    memset(out, 0, sizeof(*out));
    size_t n = m->nit;
    /* The first iteration is warm-up (caches fill, workspaces appear) when there are
     * enough to spare one. */
    size_t skip = n >= 5 ? 1 : 0;
    out->iterations = n;
    out->fitted = n - skip;
    if (n == 0)
        return;
    out->first = m->it_no[skip];
    out->last = m->it_no[n - 1];
    out->total = fit_line(cfg, m->it_alloc + skip, 1, out->fitted);
    for (int t = 0; t < MT_TAG_MAX; t++)
        out->tag[t] = fit_line(cfg, &m->it_tag[skip][t], MT_TAG_MAX, out->fitted);
}

size_t mt__model_spans(const mt_model_t *m)
{
    return m->nit;
}

int mt__model_span(const mt_model_t *m, size_t k, mt_model_span_t *out)
{
    if (k >= m->nit)
        return MT_ENOENT;
    *out = (mt_model_span_t){.iteration = m->it_no[k],
                             .allocated_at_mark = (uint64_t)m->it_alloc[k],
                             .peak = k + 1 < m->nit ? m->it_peak[k] : m->span_peak};
    return 0;
}

int mt__model_peak_span(const mt_model_t *m, size_t *k)
{
    if (m->peak_span == 0)
        return MT_ENOENT;
    *k = m->peak_span - 1;
    return 0;
}
