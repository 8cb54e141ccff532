"""`kwker bench`: prefill (pp) and generation (tg) tokens/s of Kwker and its peers, run alternately
in one process on the same weights and threads, with the machine's measured roofline.

Definitions (the same for every engine):
  pp<N>: N prompt tokens evaluated from an empty cache, N / seconds.
  tg<N>: after a 16-token prompt, N tokens decoded one at a time, (N - 1) / wall-clock seconds
         from the first new token to the last (the first token comes out of the prompt's
         evaluation; Python between steps counts).

main.py is the command's entry and its default run; peers.py the engines timed (kwker,
transformers, llama.cpp on GGUFs of the same weights); measure.py the timing, roofline probes and
RSS; report.py the tables and JSON; batch.py and speculation.py the --batch and --lookup / --draft
runs; quality.py the --quality table (what each precision costs in perplexity and KL).
"""
