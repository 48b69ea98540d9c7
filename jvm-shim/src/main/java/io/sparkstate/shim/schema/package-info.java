/**
 * What the shim keeps per schema, for the codec and the engine alike: {@link io.sparkstate.shim.schema.SchemaCache}
 * (code generated for a schema, bounded) and {@link io.sparkstate.shim.schema.LeadingColumns} (a key's leading
 * columns as generated code reads them). A leaf: it uses nothing else of the shim.
 */
package io.sparkstate.shim.schema;
