package routing

func (r *Router) exp(k string) float64 { return r.cfg.Exp[k] }
