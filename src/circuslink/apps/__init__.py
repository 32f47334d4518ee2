"""Applications built on circuslink's primitives (lattice QCD, ...): the layer above rma, channels and collectives."""
