"""Where an agent comes from: loading (tiny zoo, embedded, warm starts, directories, hub ids), export."""
