//! Cold reads: archived rows by id, fetching only the parts that can hold
//! them (cold reads are filled in by the API's history).
