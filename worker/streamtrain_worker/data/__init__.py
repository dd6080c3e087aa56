"""Reading the time-sliced log layout: pass plans, donefiles, formats, sharding, batches;
``synth`` writes that layout from a synthetic stream with a known model."""
