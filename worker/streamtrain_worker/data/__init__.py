"""Reading the time-sliced log layout: pass plans, donefiles, formats, sharding, batches."""
